"""The directory of one ``clouseau.record`` run, through the store's location layer.

It is locked before anything is read; what an earlier recording holds is read once, by
the names its ``status.json`` and ``record.json`` list (:mod:`clouseau.store.location`),
and removed only once this run has traced (:meth:`Directory.start`), so a run that fails
first (a typo in ``select``, a model that does not run) leaves the earlier recording as it
was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.store.directory import read_status
from clouseau.store.layout import FORMAT, RECORD_FILE, STATUS_FILE, graph_file, graph_id
from clouseau.store.location import check_clashes, escaped, previous_files, remove_previous
from clouseau.store.lock import DirectoryLock
from clouseau.store.progress import (
    Progress,
    check_same_run,
    read_progress,
    write_json_atomic,
)
from clouseau.store.reader import read_graph


class Directory:
    """The locked directory a recording writes; see the module docstring."""

    def __init__(
        self, root: Path, lock: DirectoryLock, on_start: Callable[[], None] | None = None
    ) -> None:
        self.root, self.lock, self._on_start = root, lock, on_start
        self.started = False
        self._previous: frozenset[str] = frozenset()
        self._keep: set[str] = set()
        self._pattern = ""
        self._run: dict[str, Any] = {}

    @staticmethod
    def open(root: Path) -> Directory:
        """Create ``root`` if missing and lock it (one writer, as for ``instrument``)."""
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CaptureError(f"cannot create {escaped(root)}: {err.strerror or err}") from None
        return Directory(root, DirectoryLock(root))

    def release(self) -> None:
        self.lock.release()

    def prepare(self, run: dict[str, Any], resume: bool, names: Collection[str]) -> Progress | None:
        """Read what is there (nothing is removed yet): the progress to continue, or None."""
        self._previous = previous_files(self.root)
        check_clashes(self.root, names, self._previous)
        self._pattern = str(run.get("filename_pattern", ""))
        self._run = run
        previous = read_progress(self.root) if resume else None
        if previous is not None:
            check_same_run(previous.run, run, self.root)
            graphs = {n for n in self._previous if graph_id(n) is not None}
            self._keep = {*previous.files, RECORD_FILE, STATUS_FILE, *graphs}
        return previous

    def start(self) -> None:
        """The run has traced: remove what the earlier recording wrote (but what a resumed
        run continues)."""
        if not self.started:
            remove_previous(self.root, self._previous, keep=self._keep)
            self.started = True
            if not self._keep:  # a fresh recording says at once that it is one
                self.write_status(Progress(self._run), 0)
            if self._on_start is not None:
                self._on_start()

    def graphs(self) -> list[Graph]:
        """The graphs of the recording being resumed."""
        graphs = []
        while (file := self.root / graph_file(len(graphs))).is_file():
            graphs.append(read_graph(file))
        return graphs

    def write_graph(self, graph_id: int, graph: Graph) -> None:
        write_json_atomic(self.root / graph_file(graph_id), graph.to_json())

    def write_status(self, progress: Progress, graphs: int) -> None:
        """``status.json`` as for ``instrument``: calls, failed calls, the files and graphs
        written, closed or not (after ``record.json``, which resume trusts)."""
        failed = {str(b.index): b.error for b in progress.batches if b.error is not None}
        status = {
            "format": FORMAT,
            "calls": len(progress.batches),
            "closed": progress.done,
            "failed_calls": failed,
            "files": list(progress.files),
            "pattern": self._pattern,
            "graphs": graphs,
        }
        write_json_atomic(self.root / STATUS_FILE, status)

    def repair(self, progress: Progress) -> None:
        """A finished recording asked to resume: nothing changes, but a ``status.json`` a
        kill left behind (``record.json`` said done, the status not yet) is completed."""
        status = read_status(self.root)
        if status is not None and status.get("closed") is True:
            return
        count = sum(1 for n in self._previous if graph_id(n) is not None)
        self.write_status(progress, count)


def forward_identity(forward: Callable[..., Any] | None) -> str | None:
    """What a resumed run compares of ``forward=``: its name and a digest of its code."""
    if forward is None:
        return None
    method = type(forward).__call__ if not hasattr(forward, "__code__") else forward
    code = getattr(method, "__code__", None)
    name = f"{getattr(forward, '__module__', '')}.{getattr(forward, '__qualname__', type(forward).__qualname__)}"
    if code is None:
        return name
    digest = hashlib.blake2b(code.co_code + repr(code.co_consts).encode(), digest_size=8)
    return f"{name}:{digest.hexdigest()}"
