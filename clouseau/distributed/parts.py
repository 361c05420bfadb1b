"""A capture written in parts by several processes, and read back as one.

Each process (a torch.distributed rank, a JAX process, a Ray actor) writes an ordinary
capture directory of its own under the capture path (``rank-00003/``), holding a
``part.json`` that says who wrote it. Rank 0 writes ``manifest.json`` before anything else,
marked incomplete, and again once every part is closed (after a collective gather of
their summaries, which is also the barrier): the files of each part and its call count.
:func:`load_parts` reads all parts as one :class:`PartedCapture`; a part that did not
finish is reported (``missing_ranks``, and a warning) and what it wrote stays usable.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clouseau.distributed.part_files import (
    read_object,
)
from clouseau.distributed.part_start import (
    batches_digest,
    begin_parts,
    lock_part,
    lock_root,
    together,
    warn_if_same_batches,
)
from clouseau.distributed.shards import ShardLog
from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue
from clouseau.store.capture import Capture
from clouseau.store.directory_sink import DirectorySink
from clouseau.store.files import write_json
from clouseau.store.layout import DEFAULT_PATTERN, STATUS_FILE
from clouseau.store.reader import load

MANIFEST = "manifest.json"
PART_FILE = "part.json"
FORMAT = "clouseau.parts/1"
_PART = re.compile(r"rank-(\d{5})")


class IncompleteCaptureWarning(UserWarning):
    """Some parts of a capture written by several processes did not finish."""


def part_name(rank: int) -> str:
    """The directory of one process's part: ``rank-00003``."""
    return f"rank-{rank:05d}"


@dataclass(frozen=True)
class Group:
    """The processes that write one capture together.

    ``gather`` is a collective every process calls with its own summary; it returns every
    process's, in rank order (it is the barrier before the manifest). ``interleave``: the
    processes split the calls (data parallel: the global call of local call ``k`` of rank
    ``r`` is ``k * world_size + r``); otherwise every process runs every call on its own
    shards (JAX's multi-controller SPMD) and the calls keep their numbers.
    """

    engine: str
    rank: int
    world_size: int
    gather: Callable[[object], Sequence[object]]
    interleave: bool = True


class ForwardingSink:
    """A sink that hands every call to ``self.inner``; subclasses add what happens around
    it (a part's manifest, an upload)."""

    inner: Any

    def add_graph(self, graph: Graph) -> int:
        return self.inner.add_graph(graph)

    def begin_call(self) -> int:
        return self.inner.begin_call()

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        self.inner.put(call, graph_id, values)

    def end_call(self, call: int) -> None:
        self.inner.end_call(call)

    def fail_call(self, call: int, error: BaseException) -> None:
        self.inner.fail_call(call, error)

    def flush(self) -> None:
        self.inner.flush()


class PartSink(ForwardingSink):
    """The sink of one process: a :class:`DirectorySink` in ``root/rank-NNNNN``.

    Parameters
    ----------
    root
        The capture path shared by every process (a local or shared file system).
    group
        Who writes: this process's rank among ``world_size``.
    max_size_mb, filename_pattern
        As for :class:`DirectorySink`.
    """

    def __init__(
        self,
        root: Path,
        group: Group,
        max_size_mb: float = 1024,
        filename_pattern: str = DEFAULT_PATTERN,
    ) -> None:
        self.root = Path(root).absolute()
        self.group = group
        self.part = self.root / part_name(group.rank)
        self._begun = False
        # Every lock before anything is touched: rank 0 the whole capture's (so a second
        # run is refused before any rank creates a part), then each rank its part's.
        self._lock = lock_root(self.root, group)
        try:
            self.inner = together(
                group, lambda: DirectorySink(self.part, max_size_mb, filename_pattern)
            )
        except BaseException:
            self._release()
            raise
        self._closed = False
        self.shards = ShardLog(self.part)
        # Called once the part is complete on disk and once the manifest is (an uploader
        # publishes them there).
        self.publish: Callable[[], None] = _nothing

    def add_graph(self, graph: Graph) -> int:
        self._begin()
        return self.inner.add_graph(graph)

    def begin_call(self) -> int:
        self._begin()
        return self.inner.begin_call()

    def _begin(self) -> None:
        # This rank has traced: the earlier capture's manifest and extra parts go now
        # (the part's own files are its DirectorySink's).
        if self._begun:
            return
        self._begun = True
        begin_parts(self.root, self.group, self.part, {"numbering": self._numbering()})

    def _numbering(self) -> str:
        # The part numbers its calls 0, 1, 2...; the reader makes them global.
        return "local" if self.group.interleave else "global"

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        if not self.group.interleave:  # SPMD: every process has every call
            values = self.shards.expand(call, values, self.group.rank)
        self.inner.put(call, graph_id, values)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not (self.part / PART_FILE).exists():
                self._begin()  # an empty capture is still a capture (none was there)
            if self._begun:
                self.shards.write()
            self.inner.close()
        finally:
            # Every rank takes part in the gather, even one whose writer failed: the
            # others would wait for it until the process group's timeout.
            self._finish()

    def capture(self) -> Capture:
        self.inner.flush()
        return load(self.part)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def _finish(self) -> None:
        summary = part_summary(self.part, self.group.rank)
        if not self._begun:  # failed before it traced: the earlier capture stays
            summary["begun"] = False
        else:
            self.publish()
        try:
            summaries = self.group.gather(summary)
        except Exception as err:  # a rank died or the group is gone: the manifest stays
            self._release()
            warnings.warn(
                f"clouseau: the manifest of {self.root} stays incomplete: gathering the parts "
                f"failed ({type(err).__name__}: {err})",
                IncompleteCaptureWarning,
                stacklevel=3,
            )
            return
        if self.group.rank == 0:
            if any(not isinstance(s, dict) or s.get("begun", True) for s in summaries):
                write_manifest(self.root, self.group, list(summaries))
                self.publish()
            self._release()


def _nothing() -> None:
    pass


class RecordPart:
    """One rank's part of a ``clouseau.record`` run under a process group.

    ``record`` writes (and resumes) its own capture in ``path``; its calls are the rank's
    batches ``0, 1, 2...``, which the reader numbers ``k * world_size + rank`` (the rank's
    share is every ``world_size``-th batch). :meth:`finish` is the gather and the manifest.
    """

    def __init__(self, root: Path, group: Group) -> None:
        self.root, self.group = Path(root).absolute(), group
        self.path = self.root / part_name(group.rank)
        self._root_lock = lock_root(self.root, group)
        try:
            self.lock = together(group, lambda: lock_part(self.path))
        except BaseException:
            if self._root_lock is not None:
                self._root_lock.release()
            raise
        self.about = {"format": FORMAT, "engine": group.engine, "rank": group.rank}
        self.about |= {"world_size": group.world_size, "numbering": "local", "kind": "record"}

    def start(self) -> None:
        """This rank's run has traced: the part says who writes it, rank 0 the manifest."""
        begin_parts(self.root, self.group, self.path, self.about)

    def finish(self) -> None:
        """Every rank has recorded its share: rank 0 writes the complete manifest."""
        # record's own status may be that of an interrupted run this one resumed (and
        # found done): the part says itself that it is finished, and how many batches.
        done = {"finished": True, "recorded": len(load(self.path).calls)}
        write_json(self.path / PART_FILE, self.about | done, replace=True)
        try:
            summaries = self.group.gather(part_summary(self.path, self.group.rank))
            if self.group.rank == 0:
                write_manifest(self.root, self.group, list(summaries))
                warn_if_same_batches(self.path, self.group, summaries)
        finally:
            if self._root_lock is not None:
                self._root_lock.release()


def part_summary(part: Path, rank: int) -> dict[str, Any]:
    """What the manifest records of a closed part: its files and its call count."""
    summary = {
        "name": part.name,
        "rank": rank,
        "files": visible_files(part),
        "calls": part_calls(part),
    }
    digest = batches_digest(part)
    return summary if digest is None else {**summary, "batches": digest}


def part_calls(part: Path) -> int:
    about = read_object(part / PART_FILE)
    if about.get("kind") == "record":
        calls = about.get("recorded", 0)
    else:
        calls = read_object(part / STATUS_FILE).get("calls", 0)
    return calls if isinstance(calls, int) else 0


def closed_part(part: Path, about: Mapping[str, Any]) -> bool:
    if about.get("kind") == "record":
        return about.get("finished") is True
    return read_object(part / STATUS_FILE).get("closed") is True


def visible_files(part: Path) -> list[str]:
    if not part.is_dir() or part.is_symlink():
        return []
    return sorted(
        f.name
        for f in part.glob("*.safetensors")
        if not f.name.startswith(".") and not f.is_symlink() and f.is_file()
    )


def write_manifest(root: Path, group: Group, parts: list[Any] | None) -> None:
    manifest = {
        "format": FORMAT,
        "engine": group.engine,
        "world_size": group.world_size,
        "interleave": group.interleave,
        "complete": parts is not None,
        "parts": parts if parts is not None else [],
    }
    write_json(root / MANIFEST, manifest, replace=True)


def is_parted(path: Path) -> bool:
    """Whether ``path`` is a capture written in parts (a manifest, or ``rank-*`` parts).

    Links count (a manifest or a part that is a link is then refused, by name, as
    damaged), so that a planted link never turns a parted capture into a plain one.
    """
    if os.path.lexists(path / MANIFEST):
        return True
    with os.scandir(path) as children:
        return any(
            _PART.fullmatch(c.name) and (c.is_symlink() or c.is_dir(follow_symlinks=False))
            for c in children
        )
