"""Reading a capture written in parts back as one (``clouseau.load`` of a parted path).

The manifest is checked against the parts on disk (a part it lists must hold the files and
calls it says), each part is loaded as an ordinary capture, and the parts' call and graph
numbers are made global: a part that did not finish is reported (``missing_ranks``, and a
warning) and what it wrote stays usable.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clouseau.distributed.merged import PartedCapture
from clouseau.distributed.part_files import (
    MAX_WORLD,
    is_part_summary,
    is_world,
    read_object,
    scan_parts,
)
from clouseau.distributed.parts import (
    _PART,
    FORMAT,
    MANIFEST,
    PART_FILE,
    IncompleteCaptureWarning,
    closed_part,
    part_calls,
    part_name,
    visible_files,
)
from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.store.capture import Capture, Entry
from clouseau.store.layout import STATUS_FILE
from clouseau.store.progress import Progress, read_progress
from clouseau.store.reader import load


def load_parts(root: Path, strict: bool = False) -> PartedCapture:
    """Read every part of ``root`` as one capture (``clouseau.load`` calls this).

    Raises
    ------
    CaptureError
        The manifest disagrees with the parts on disk (a part it lists is absent or holds
        other files or calls, a part it does not list is present), or is damaged; with
        ``strict``, a damaged file in a part.
    """
    from clouseau.distributed.blocks import is_blocks, load_blocks

    if is_blocks(root):  # written by Ray workers (clouseau.ray.record)
        return load_blocks(root)  # type: ignore[return-value]
    manifest = _read_manifest(root)
    on_disk, links = scan_parts(root, _PART)
    world = int(manifest["world_size"]) if manifest else _world_from_parts(root, on_disk)
    listed = {part_name(r): r for r in range(world)}
    stray = [name for name in [*on_disk, *links] if name not in listed]
    if stray:
        raise CaptureError(
            f"{root}: the manifest lists {world} part(s) but {', '.join(stray)} is also there; "
            "remove the stray part(s), or record again into an empty path"
        )
    complete = bool(manifest and manifest["complete"])
    expected = _expected_parts(root, manifest) if complete else {}
    merged = _Merged()
    merged.damaged.update(links)
    present = set(on_disk)
    for name, rank in listed.items():
        part = root / name
        if name not in present:  # absent, or a link that is not followed
            if expected.get(name) is not None:
                why = f", which is {links[name]}" if name in links else ", which is not there"
                raise CaptureError(f"{root / MANIFEST} lists {name}{why}")
            merged.missing.append(rank)
            continue
        if not _part_finished(root, part, rank, world, expected.get(name)):
            merged.missing.append(rank)
        if os.path.lexists(part / STATUS_FILE) or visible_files(part):
            local = read_object(part / PART_FILE).get("numbering") == "local"
            renumber = _Renumber(world, rank) if local else None
            keep = expected.get(name, {}).get("calls_kept")
            merged.add(rank, load(part, strict=strict), renumber, keep)
            progress = read_progress(part)
            if progress is not None:  # a part of clouseau.record: its batches, its stats
                merged.progress[rank] = (progress, renumber or (lambda call: call))
    if merged.missing:
        warnings.warn(
            f"clouseau: {root} is incomplete: rank(s) {merged.missing} of {world} did not "
            "finish; the capture holds what the others (and the complete files of those) wrote",
            IncompleteCaptureWarning,
            stacklevel=3,
        )
    return merged.capture(root, world, closed=complete and not merged.missing)


@dataclass(frozen=True)
class _Renumber:
    """A part's local call ``k`` is global call ``k * world + rank``."""

    world: int
    rank: int

    def __call__(self, call: int) -> int:
        return call * self.world + self.rank


class _Merged:
    """The parts read so far: entries with graph ids made global, and what each says."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.graphs: list[Graph] = []
        self.failed: dict[int, str] = {}
        self.partial: dict[int, str] = {}
        self.damaged: dict[str, str] = {}
        self.ranks: dict[int, int] = {}
        self.missing: list[int] = []
        self.calls_made = 0
        self.progress: dict[int, tuple[Progress, Callable[[int], int]]] = {}

    def add(
        self, rank: int, cap: Capture, renumber: _Renumber | None, keep: list[int] | None
    ) -> None:
        from clouseau.distributed.shards import entries_of

        offset = len(self.graphs)
        glob = renumber or (lambda call: call)
        self.graphs.extend(cap.graphs)
        for entry in entries_of(cap):
            old = entry.record
            if keep is not None and old.call not in keep:
                continue  # the manifest keeps this call from another part
            record = replace(old, call=glob(old.call), graph=old.graph + offset)
            self.entries.append(replace(entry, record=record))  # a shard stays one
            self.ranks.setdefault(record.call, rank)
        self.failed.update({glob(c): why for c, why in cap.failed_calls.items()})
        self.partial.update({glob(c): why for c, why in cap.partial_calls.items()})
        name = part_name(rank)
        self.damaged.update({f"{name}/{k}": v for k, v in cap.damaged.items()})
        self.calls_made = max(self.calls_made, max(map(glob, cap.calls), default=-1) + 1)

    def capture(self, root: Path, world: int, closed: bool) -> PartedCapture:
        from clouseau.distributed.shards import assemble

        return PartedCapture(
            assemble(tuple(self.entries)),
            tuple(self.graphs),
            self.failed,
            root,
            world_size=world,
            missing_ranks=tuple(self.missing),
            ranks=self.ranks,
            progress=self.progress,
            partial_calls=self.partial,
            damaged=self.damaged,
            calls_made=self.calls_made,
            closed=closed,
        )


def _world_from_parts(root: Path, names: list[str]) -> int:
    # No manifest: rank 0 died before writing it; each part says how many there were.
    sizes = [read_object(root / n / PART_FILE).get("world_size") for n in names]
    for name, size in zip(names, sizes, strict=True):
        if size is not None and not is_world(size):
            raise CaptureError(
                f"{root / name / PART_FILE} is damaged: world_size {size!r:.40} is not a "
                f"process count from 1 to {MAX_WORLD}; record again into an empty path"
            )
    ranks = [int(n[5:]) + 1 for n in names]
    return max([s for s in sizes if isinstance(s, int)] + ranks)


def _expected_parts(root: Path, manifest: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    parts = manifest["parts"]
    if not isinstance(parts, list) or len(parts) != manifest["world_size"]:
        count = len(parts) if isinstance(parts, list) else "no list of"
        raise CaptureError(
            f"{root / MANIFEST} is complete but lists {count} parts for "
            f"{manifest['world_size']} processes; the capture was not written by clouseau "
            "as it stands: record it again"
        )
    for part in parts:
        if not is_part_summary(part):
            raise CaptureError(
                f"{root / MANIFEST} is damaged: {str(part)[:80]!r} is not a part's summary "
                '({"name": "rank-NNNNN", "rank", "files": [...], "calls"}); record again'
            )
    return {p["name"]: p for p in parts}


def _part_finished(
    root: Path, part: Path, rank: int, world: int, expected: Mapping[str, Any] | None
) -> bool:
    about = read_object(part / PART_FILE)
    if about and (about.get("rank") != rank or about.get("world_size") != world):
        raise CaptureError(
            f"{part / PART_FILE} says rank {about.get('rank')} of {about.get('world_size')}, "
            f"but the manifest expects rank {rank} of {world}: parts of different runs are "
            "mixed; record again into an empty path"
        )
    closed = closed_part(part, about) if about else False
    if expected is None:
        return closed
    files, calls = visible_files(part), part_calls(part)
    if not closed or files != list(expected["files"]) or calls != expected["calls"]:
        raise CaptureError(
            f"{root / MANIFEST} disagrees with {part.name}: it lists {expected['calls']} "
            f"call(s) in {list(expected['files'])}, the part holds {calls} in {files}"
            f"{'' if closed else ' and was never closed'}; the part was changed after the "
            "run: record it again"
        )
    return True


def _read_manifest(root: Path) -> dict[str, Any] | None:
    if not os.path.lexists(root / MANIFEST):
        return None
    manifest = read_object(root / MANIFEST)
    if manifest.get("format") != FORMAT:
        raise CaptureError(
            f"{root / MANIFEST} is not a clouseau manifest ({FORMAT}); point load() at a "
            "capture path written by clouseau"
        )
    if not is_world(manifest.get("world_size")) or type(manifest.get("complete")) is not bool:
        raise CaptureError(
            f"{root / MANIFEST} is damaged: world_size {manifest.get('world_size')!r:.40} is "
            f"not a process count from 1 to {MAX_WORLD}, or complete is not true or false; "
            "record again into an empty path"
        )
    return manifest
