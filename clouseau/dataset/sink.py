"""The sink of ``clouseau.record``: one call per batch, files that hold whole batches.

A file is cut only between batches, so a batch is on disk completely or not at all. Full
files go to a writer thread (one at a time, so the next batches run while it writes); after
each file is renamed into place the writer replaces the progress record (``record.json``,
see :mod:`clouseau.store.progress`) with one that lists it. Resume trusts that record
alone: a file the record does not list (killed between the rename and the record) is
removed and its batches run again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue
from clouseau.store.capture import Capture, Record, encode_record, tensor_key
from clouseau.store.layout import FORMAT
from clouseau.store.safetensors_io import dtype_code, storable, write_file

# Applied to each saved value as it arrives: (name, array) -> the array to store (the rows
# layout turns a [batch, seq, ...] value into its unmasked rows).
Shaper = Callable[[tuple[str, ...], np.ndarray], np.ndarray]


@dataclass(frozen=True)
class FileJob:
    """One file to write and the progress snapshot that lists it once written."""

    path: Path
    items: tuple[tuple[Record, np.ndarray], ...]
    on_written: Callable[[], None]


class BatchSink:
    """Numbers calls by batch, buffers whole batches, and writes files between batches.

    Parameters
    ----------
    path
        The capture directory (prepared by the caller).
    graphs
        The graphs already recorded (a resumed run): a re-traced graph equal to one of them
        keeps its id.
    write_graph
        Writes ``graph-NNN.json`` for a new graph id.
    """

    def __init__(
        self,
        path: Path,
        graphs: Sequence[Graph],
        write_graph: Callable[[int, Graph], None],
    ) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._graphs = list(graphs)
        self._graph_json = [g.to_json() for g in graphs]
        self._write_graph = write_graph
        self.batch = -1  # the batch being run; its call index
        self.began = 0  # begin_call()s in this batch: one model call per batch
        self.pending: list[tuple[Record, np.ndarray]] = []  # the running batch
        self.buffer: list[tuple[Record, np.ndarray]] = []  # whole batches, not yet written
        self.buffer_bytes = 0
        self.failed: dict[int, str] = {}
        self.shaper: Shaper | None = None
        self._cv = threading.Condition()
        self._job: FileJob | None = None
        self.error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="clouseau-record", daemon=True)
        self._thread.start()

    @property
    def graphs(self) -> tuple[Graph, ...]:
        """The graphs of the recording so far (ids in order)."""
        with self._lock:
            return tuple(self._graphs)

    # -- the Sink protocol -------------------------------------------------------------
    def add_graph(self, graph: Graph) -> int:
        with self._lock:
            data = graph.to_json()
            if data in self._graph_json:
                return self._graph_json.index(data)
            self._graphs.append(graph)
            self._graph_json.append(data)
            graph_id = len(self._graphs) - 1
            self._write_graph(graph_id, graph)
            return graph_id

    def begin_call(self) -> int:
        with self._lock:
            if self.batch < 0:
                raise CaptureError(
                    "the model of clouseau.record was called outside the recording loop; "
                    "call it only from record's `forward`"
                )
            self.began += 1
            return self.batch

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        with self._lock:
            self.raise_error()
            order = len(self.pending)
            for value in values:
                array = np.asarray(value.array)
                dtype_code(array.dtype)
                if self.shaper is not None:
                    array = self.shaper(tuple(value.names), array)
                self._add(value.names, value.node, call, graph_id, array, value.index, order)
                order += 1

    def put_field(self, name: str, array: np.ndarray) -> None:
        """Store a per-row field (token ids, sample, position) in the running batch."""
        with self._lock:
            # A copy: the array may view the batch's memory, which a loader may reuse.
            owned = np.array(array, copy=True)
            self._add((name,), "field", self.batch, 0, owned, (), len(self.pending))

    def end_call(self, call: int) -> None:
        pass

    def fail_call(self, call: int, error: BaseException) -> None:
        with self._lock:
            message = str(error)
            self.failed[call] = (
                f"{type(error).__name__}: {message}" if message else type(error).__name__
            )

    def flush(self) -> None:
        pass  # files are cut by the record loop, between batches

    def close(self) -> None:
        pass

    def capture(self) -> Capture:
        raise CaptureError("read a recording with clouseau.load(path) once record returns")

    # -- batches and files -------------------------------------------------------------
    def _add(
        self,
        names: tuple[str, ...],
        node: str,
        call: int,
        graph_id: int,
        array: np.ndarray,
        index: tuple[int, ...],
        order: int,
    ) -> None:
        key = tensor_key(names[0], call, tuple(index))
        if any(r.key == key for r, _ in self.pending):
            key = f"{key}~{order}"
        record = Record(key, tuple(names), node, call, order, graph_id, tuple(index))
        self.pending.append((record, storable(array)))

    def start_batch(self, batch: int) -> None:
        with self._lock:
            self.batch, self.began, self.pending = batch, 0, []

    def drop_batch(self) -> None:
        """Forget what a failed batch put: a failed batch stores nothing."""
        with self._lock:
            self.pending = []

    def end_batch(self) -> None:
        with self._lock:
            if self.began > 1:
                raise CaptureError(
                    f"batch {self.batch} called the model {self.began} times; record's "
                    "`forward` must call it once per batch"
                )
            self.buffer.extend(self.pending)
            self.buffer_bytes += sum(a.nbytes for _, a in self.pending)
            self.pending = []

    def submit(self, path: Path, on_written: Callable[[], None]) -> None:
        """Hand the buffered batches to the writer thread as one file (waits for the last)."""
        job = FileJob(path, tuple(self.buffer), on_written)
        with self._cv:
            while self._job is not None:
                self._cv.wait()
            self.raise_error()
            self._job = job
            self._cv.notify_all()
        self.buffer, self.buffer_bytes = [], 0

    def wait(self) -> None:
        """Wait until every submitted file is written; raise the writer's error if any."""
        with self._cv:
            while self._job is not None:
                self._cv.wait()
        self.raise_error()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._stopping:
                    self._cv.wait()
                if self._job is None:
                    return
                job = self._job
            try:
                if self.error is None:
                    write_batches(job)
            except BaseException as err:
                self.error = err
            finally:
                with self._cv:
                    self._job = None
                    self._cv.notify_all()


def write_batches(job: FileJob) -> None:
    """Write one file of whole batches, then record that it is complete."""
    records = "[" + ",".join(encode_record(r) for r, _ in job.items) + "]"
    write_file(
        job.path, [(r.key, a) for r, a in job.items], {"format": FORMAT, "clouseau": records}
    )
    job.on_written()
