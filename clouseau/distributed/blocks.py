"""A capture written block by block by workers that may die and be retried (Ray Data).

Each worker writes a part of its own (``part-<id>/``: its graphs and ``part.json``) and one
file per block of rows it ran, written atomically, so a block is on disk whole or not at
all. A block is named by its rows when the data numbers them (``block-<first>-<digest>``,
the same name when it runs again), else by a digest of its content and a nonce
(``block-c<digest>-<nonce>``), the rows being numbered by the driver in the order of the
data. A worker killed after it wrote a block but before it reported it makes the engine
run the block again, elsewhere: the same block may then be in two parts. ``manifest.json``
(format ``clouseau.blocks/1``) lists each block once, with the part that holds it and its
rows; the reader keeps only those. Calls are numbered by the blocks' first rows: call
``i`` is the ``i``-th block of the data.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.store.capture import Capture, Entry
from clouseau.store.files import read_json, write_json
from clouseau.store.layout import graph_file, graph_id, is_exact_temp_name
from clouseau.store.location import remove_empty
from clouseau.store.progress import Batch
from clouseau.store.reader import file_entries, read_graph
from clouseau.store.safetensors_io import read_header

FORMAT = "clouseau.blocks/1"
MANIFEST = "manifest.json"
PART_FILE = "part.json"
# Named by rows (first row, digest of all) or by content (digest, then a nonce).
_BLOCK = re.compile(r"block-(?:\d{12}-[0-9a-f]{16}|c[0-9a-f]{32}-[0-9a-f]{8})\.safetensors")
_PART = re.compile(r"part-[0-9a-f]{12}")


@dataclass(frozen=True)
class Block:
    """One block of rows, written once: the file that holds it and the rows it ran.

    ``rows`` are ``[start, stop)`` ranges of row numbers of the data (one range unless the
    engine joined rows from apart).
    """

    part: str
    file: str
    rows: tuple[tuple[int, int], ...]

    @property
    def start(self) -> int:
        return self.rows[0][0]

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part, "file": self.file, "rows": [list(r) for r in self.rows]}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Block:
        """The block ``to_json`` wrote; ValueError if ``data`` is not one (names included:
        a part or file that is not clouseau's would lead the reader outside the capture)."""
        try:
            rows = tuple((int(a), int(b)) for a, b in data["rows"])
            block = Block(data["part"], data["file"], rows)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a block ({type(err).__name__}: {err})") from None
        if not (
            isinstance(block.part, str)
            and isinstance(block.file, str)
            and _PART.fullmatch(block.part)
            and _BLOCK.fullmatch(block.file)
            and all(0 <= a < b for a, b in rows)
        ):
            raise ValueError(f"not a block of clouseau's ({str(dict(data))[:80]})")
        return block


def block_file(rows: np.ndarray) -> str:
    """The deterministic name of the block of ``rows`` (its first row and a digest of all)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    digest = hashlib.blake2b(rows.tobytes(), digest_size=8).hexdigest()
    return f"block-{int(rows.min()):012d}-{digest}.safetensors"


def content_digest(columns: Mapping[str, np.ndarray]) -> str:
    """A digest of a batch's columns (names, dtypes, shapes and bytes)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(columns):
        array = np.ascontiguousarray(columns[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(array.data if array.dtype.kind != "O" else repr(array.tolist()).encode())
    return digest.hexdigest()


def content_file(content: str) -> str:
    """A new file name for a block of rows known by ``content``: unique to this write, so
    a retried block never replaces a file the manifest lists."""
    return f"block-c{content}-{uuid.uuid4().hex[:8]}.safetensors"


def content_of(file: str) -> str | None:
    """The content digest a file name of :func:`content_file` holds, else None."""
    return file[7:39] if file.startswith("block-c") and _BLOCK.fullmatch(file) else None


def row_ranges(rows: np.ndarray) -> tuple[tuple[int, int], ...]:
    """``rows`` (sorted) as ``[start, stop)`` ranges of consecutive numbers."""
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    if rows.size == 0:
        return ()
    cuts = np.flatnonzero(np.diff(rows) != 1) + 1
    return tuple((int(r[0]), int(r[-1]) + 1) for r in np.split(rows, cuts))


def write_manifest(root: Path, run: Mapping[str, Any], blocks: Iterable[Block], complete: bool):
    """Replace ``root/manifest.json``: the run, and each block (in the order of its rows)."""
    kept = sorted(blocks, key=lambda b: (b.start, b.file))
    manifest = {
        "format": FORMAT,
        "engine": "ray",
        "run": dict(run),
        "complete": complete,
        "blocks": [b.to_json() for b in kept],
    }
    write_json(root / MANIFEST, manifest, replace=True)


def read_manifest(root: Path) -> dict[str, Any] | None:
    """The manifest of a block capture in ``root``, or None if there is none."""
    file = root / MANIFEST
    if not os.path.lexists(file):
        return None
    data = read_json(file)  # bounded: a regular file, never a link, FIFO or device
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data


def is_blocks(root: Path) -> bool:
    """Whether ``root`` holds a capture written in blocks (a ``clouseau.blocks`` manifest)."""
    return read_manifest(root) is not None


def found_blocks(root: Path) -> dict[str, Block]:
    """Every block file on disk under ``root``'s parts, by file name (one per block)."""
    found: dict[str, Block] = {}
    parts = (p for p in root.iterdir() if _PART.fullmatch(p.name) and not p.is_symlink())
    for part in sorted(p for p in parts if p.is_dir()):
        for file in sorted(part.iterdir()):
            if _BLOCK.fullmatch(file.name) and file.name not in found:
                found[file.name] = Block(part.name, file.name, _rows_of(file))
    return found


def _rows_of(file: Path) -> tuple[tuple[int, int], ...]:
    # A damaged block file has no rows: it is not counted (and is written again on resume).
    try:
        rows = json.loads(read_header(file)[0].get("clouseau.rows", "[]"))
        return tuple((int(a), int(b)) for a, b in rows)
    except (CaptureError, ValueError, TypeError, RecursionError):
        return ()


def remove_unlisted(root: Path, blocks: Iterable[Block]) -> None:
    """Remove the block files of ``root``'s parts that ``blocks`` do not list (the work of
    actors killed before they reported it, written again elsewhere)."""
    listed = {(b.part, b.file) for b in blocks}
    for part in (p for p in root.iterdir() if _PART.fullmatch(p.name) and p.is_dir()):
        for file in part.iterdir():
            if _BLOCK.fullmatch(file.name) and (part.name, file.name) not in listed:
                file.unlink(missing_ok=True)


def earlier_parts(root: Path, *, any_manifest: bool = False) -> tuple[str, ...]:
    """The parts of an earlier block capture in ``root`` (read before a new run starts);
    with ``any_manifest``, the parts there whether a manifest is or not."""
    if not any_manifest and read_manifest(root) is None:
        return ()
    return tuple(
        sorted(
            c.name
            for c in root.iterdir()
            if _PART.fullmatch(c.name) and not c.is_symlink() and c.is_dir()
        )
    )


def clear(root: Path, parts: Iterable[str]) -> None:
    """Remove the parts ``parts`` of an earlier block capture in ``root``: clouseau's own
    files by their names (blocks, graphs, ``part.json``, a worker's temporary files), each
    directory only if nothing else is left in it."""
    for name in parts:
        part = root / name
        if not part.is_dir() or part.is_symlink():
            continue
        ours = [
            f.name
            for f in part.iterdir()
            if _BLOCK.fullmatch(f.name)
            or graph_id(f.name) is not None
            or f.name == PART_FILE
            or is_exact_temp_name(f.name)
        ]
        remove_empty(part, ours)


class IncompleteBlocksWarning(UserWarning):
    """A capture written in blocks was not finished: it holds the blocks written so far."""


class BlockCapture(Capture):
    """A capture written in blocks (``clouseau.ray.record``), read as one.

    Call ``i`` is the ``i``-th block of the data (by first row); ``batches`` gives each
    block's rows, ``part(call)`` the worker part that holds it.
    """

    def __init__(
        self,
        *args: Any,
        blocks: Sequence[Block],
        stats: Sequence[Mapping[str, Any]] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._blocks = tuple(blocks)
        self._stats = tuple(stats)

    def stats(self, name: str) -> Any:
        """The running statistics of ``name`` over the blocks (``stats=`` of the run)."""
        from clouseau.distributed.block_layout import merged_stats

        result = merged_stats(self._stats, name)
        if result is None:
            raise KeyError(
                f"no statistics of {name!r} in this capture; record with "
                f"clouseau.ray.record(..., stats=True) (or stats=[{name!r}])"
            )
        return result

    @property
    def batches(self) -> tuple[Batch, ...]:
        """Each block as a ``Batch``: its call, and its rows ``start``..``stop`` of the data."""
        return tuple(Batch(i, b.start, b.rows[-1][1], "") for i, b in enumerate(self._blocks))

    def part(self, call: int) -> str:
        """The part (worker) directory that holds ``call``."""
        return self._blocks[call].part


def load_blocks(root: Path) -> BlockCapture:
    """Read the blocks of ``root`` as one capture (``clouseau.load`` calls this).

    Raises
    ------
    CaptureError
        A block the manifest lists is not on disk, or two blocks hold the same rows.
    """
    manifest = read_manifest(root)
    if manifest is None:
        raise CaptureError(f"{root} holds no {MANIFEST} of a capture written in blocks")
    complete = manifest.get("complete") is True
    listed = _listed_blocks(root, manifest)
    if not complete:
        # The driver stopped before the end: blocks written after its last manifest are
        # whole (written atomically), so they count too where their file names the rows.
        files = {b.file for b in listed}
        listed += [b for b in found_blocks(root).values() if b.rows and b.file not in files]
        warnings.warn(
            f"clouseau: {root} was not finished: it holds the {len(listed)} block(s) written "
            "so far; clouseau.ray.record(..., resume=True) runs the rest",
            IncompleteBlocksWarning,
            stacklevel=3,
        )
    blocks = sorted(listed, key=lambda b: (b.start, b.file))
    _check_disjoint(root, blocks)
    graphs: list[Graph] = []
    offsets: dict[str, int] = {}
    entries: list[Entry] = []
    stats: list[Mapping[str, Any]] = []
    for call, block in enumerate(blocks):
        if block.part not in offsets:
            offsets[block.part] = len(graphs)
            graphs.extend(_part_graphs(root / block.part))
        entries.extend(_block_entries(root, block, call, offsets[block.part], stats))
    return BlockCapture(
        tuple(entries), tuple(graphs), {}, root, closed=complete, blocks=blocks,
        calls_made=len(blocks), stats=stats,
    )  # fmt: skip


def _listed_blocks(root: Path, manifest: Mapping[str, Any]) -> list[Block]:
    items = manifest.get("blocks", [])
    try:
        if not isinstance(items, list):
            raise ValueError("blocks is not a list")
        return [Block.from_json(b if isinstance(b, dict) else {}) for b in items]
    except ValueError as err:
        raise CaptureError(
            f"{root / MANIFEST} is damaged: its block list is not clouseau's ({err}); record "
            "again into an empty path"
        ) from None


def _check_disjoint(root: Path, blocks: Sequence[Block]) -> None:
    spans = sorted((a, b, blk.file) for blk in blocks for a, b in blk.rows)
    for (_, stop, first), (start, _, second) in itertools.pairwise(spans):
        if start < stop:
            raise CaptureError(
                f"{root / MANIFEST} disagrees with the parts: {first} and {second} hold the "
                "same rows; the capture was changed after the run: record it again"
            )


def _part_graphs(part: Path) -> list[Graph]:
    graphs = []
    while (file := part / graph_file(len(graphs))).is_file():
        graphs.append(read_graph(file))
    return graphs


def _block_entries(
    root: Path, block: Block, call: int, graph_offset: int, stats: list[Mapping[str, Any]]
) -> list[Entry]:
    file = root / block.part / block.file
    if (root / block.part).is_symlink() or not os.path.lexists(file):
        raise CaptureError(
            f"{root / MANIFEST} lists {block.part}/{block.file}, which is not there (or is "
            "reached through a link, which is not followed); the capture was changed after "
            "the run: record it again (or resume=True)"
        )
    from clouseau.distributed.block_layout import SAMPLES_KEY, STATS_KEY, global_samples

    metadata, _ = read_header(file)
    local = metadata.get(SAMPLES_KEY) == "local"
    if STATS_KEY in metadata:
        stats.append(json.loads(metadata[STATS_KEY]))
    entries = []
    for entry in file_entries(file):  # checked: a damaged file is a CaptureError naming it
        record = entry.record
        moved = replace(record, call=call, graph=record.graph + graph_offset)
        load = entry.load
        if local and record.node == "field" and record.name == "sample":
            load = global_samples(block.rows, load)  # counted in the block: in the data
        entries.append(Entry(moved, load))
    return entries
