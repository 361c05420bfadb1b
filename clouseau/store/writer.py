"""Sinks: where an instrumented model's saved values go (a directory, or memory).

:class:`DirectorySink` buffers arrays until the next one would push the file past
``max_size_mb``, then hands the full file to a writer thread so disk I/O overlaps the next
forward pass. Each file is written under a temporary name and renamed when complete; an
array is never split. The IR of each traced signature is written as ``graph-NNN.json`` and
the state of the calls (which failed, and why) as ``status.json``, both atomically.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue
from clouseau.store.capture import Capture, Entry, Record, encode_records, tensor_key
from clouseau.store.safetensors_io import dtype_code, write_file

STATUS_FILE = "status.json"
GRAPH_PATTERN = "graph-{:03d}.json"
FORMAT = "clouseau.capture/1"


class _Calls:
    """Call numbering and per-call order, shared by both sinks. Callers hold the lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.graphs: list[Graph] = []
        self.next_call = 0
        self.order: dict[int, int] = {}
        self.failed: dict[int, str] = {}
        self.closed = False

    def begin(self) -> int:
        self._check_open()
        call, self.next_call = self.next_call, self.next_call + 1
        self.order[call] = 0
        return call

    def records(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> list[tuple[Record, np.ndarray]]:
        self._check_open()
        out = []
        for value in values:
            array = np.asarray(value.array)
            dtype_code(array.dtype)  # reject unstorable dtypes before anything is buffered
            order = self.order.get(call, 0)
            self.order[call] = order + 1
            key = tensor_key(value.name, call, value.index)
            out.append((Record(key, value.names, value.node, call, order, graph_id, value.index), array))
        return out

    def _check_open(self) -> None:
        if self.closed:
            raise CaptureError("this capture is closed: create a new instrumented model to capture again")


class MemorySink:
    """Keeps everything in memory (``instrument(..., path=None)``)."""

    def __init__(self) -> None:
        self._calls = _Calls()
        self._items: list[tuple[Record, np.ndarray]] = []

    def add_graph(self, graph: Graph) -> int:
        with self._calls.lock:
            self._calls.graphs.append(graph)
            return len(self._calls.graphs) - 1

    def begin_call(self) -> int:
        with self._calls.lock:
            return self._calls.begin()

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        with self._calls.lock:
            self._items.extend(self._calls.records(call, graph_id, values))

    def end_call(self, call: int) -> None:
        pass

    def fail_call(self, call: int, error: BaseException) -> None:
        with self._calls.lock:
            self._calls.failed[call] = _describe(error)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._calls.closed = True

    def capture(self) -> Capture:
        with self._calls.lock:
            entries = tuple(Entry(r, _loader(a)) for r, a in self._items)
            return Capture(entries, tuple(self._calls.graphs), self._calls.failed)


def _loader(array: np.ndarray):  # noqa: ANN202 - a closure per array
    return lambda: array


class DirectorySink:
    """Writes rolling safetensors files into a capture directory."""

    def __init__(self, path: str | os.PathLike[str], max_size_mb: float = 1024, filename_pattern: str = "activations-{idx:03d}.safetensors") -> None:
        self.path = Path(path)
        self.max_bytes = _max_bytes(max_size_mb)
        _check_pattern(filename_pattern)
        self.filename_pattern = filename_pattern
        _prepare_directory(self.path, filename_pattern)
        self._calls = _Calls()
        self._buffer: list[tuple[Record, np.ndarray]] = []
        self._buffer_bytes = 0
        self._file_index = 0
        self._files: list[Path] = []
        self._error: BaseException | None = None
        self._jobs: queue.Queue[tuple[Path, list[tuple[Record, np.ndarray]]] | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._write_loop, name=f"clouseau-writer:{self.path}", daemon=True)
        self._thread.start()
        self._write_status()
        ref = weakref.ref(self)
        self._atexit = lambda: (s := ref()) is not None and s.close()
        atexit.register(self._atexit)

    # -- the Sink protocol -------------------------------------------------------------
    def add_graph(self, graph: Graph) -> int:
        with self._calls.lock:
            self._calls.graphs.append(graph)
            graph_id = len(self._calls.graphs) - 1
            _write_json(self.path / GRAPH_PATTERN.format(graph_id), graph.to_json())
            return graph_id

    def begin_call(self) -> int:
        with self._calls.lock:
            return self._calls.begin()

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        with self._calls.lock:
            self._raise_writer_error()
            for record, array in self._calls.records(call, graph_id, values):
                if self._buffer and self._buffer_bytes + array.nbytes > self.max_bytes:
                    self._submit()
                self._buffer.append((record, array))
                self._buffer_bytes += array.nbytes

    def end_call(self, call: int) -> None:
        pass

    def fail_call(self, call: int, error: BaseException) -> None:
        with self._calls.lock:
            self._calls.failed[call] = _describe(error)
            self._submit()
            self._write_status()

    def flush(self) -> None:
        with self._calls.lock:
            self._submit()
            self._jobs.join()
            self._raise_writer_error()

    def close(self) -> None:
        with self._calls.lock:
            if self._calls.closed:
                return
            try:
                self.flush()
            finally:
                self._calls.closed = True
                self._jobs.put(None)
                self._thread.join()
                atexit.unregister(self._atexit)
                self._write_status()

    def capture(self) -> Capture:
        self.flush()
        from clouseau.store.reader import load

        return load(self.path)

    # -- internals ---------------------------------------------------------------------
    def _submit(self) -> None:
        if not self._buffer:
            return
        name = self.filename_pattern.format(idx=self._file_index)
        self._file_index += 1
        self._files.append(self.path / name)
        self._jobs.put((self.path / name, self._buffer))  # blocks while a file is being written
        self._buffer, self._buffer_bytes = [], 0

    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            file, items = job
            try:
                if self._error is None:
                    metadata = {"format": FORMAT, "clouseau": encode_records([r for r, _ in items])}
                    write_file(file, [(r.key, a) for r, a in items], metadata)
            except BaseException as err:  # reported to the caller at the next put/flush/close
                self._error = err
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            err = self._error
            raise CaptureError(
                f"writing the capture to {self.path} failed: {err}. Files written before are "
                "complete and load with clouseau.load; free disk space or pick another path."
            ) from err

    def _write_status(self) -> None:
        status = {
            "format": FORMAT,
            "calls": self._calls.next_call,
            "closed": self._calls.closed,
            "failed_calls": {str(k): v for k, v in sorted(self._calls.failed.items())},
        }
        try:
            _write_json(self.path / STATUS_FILE, status)
        except OSError as err:
            if self._error is None:
                self._error = err


def _max_bytes(max_size_mb: float) -> int:
    if isinstance(max_size_mb, bool) or not isinstance(max_size_mb, int | float) or not max_size_mb > 0:
        raise ValueError(f"max_size_mb must be a positive number of megabytes (e.g. 1024); got {max_size_mb!r}")
    return int(max_size_mb * 2**20)


def _check_pattern(pattern: str) -> None:
    try:
        first, second = pattern.format(idx=0), pattern.format(idx=1)
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"filename_pattern {pattern!r} is invalid ({err}); use e.g. 'activations-{{idx:03d}}.safetensors'") from None
    if first == second:
        raise ValueError(
            f"filename_pattern {pattern!r} has no {{idx}} field, so every rolled file would "
            "overwrite the last; use e.g. 'activations-{idx:03d}.safetensors'"
        )
    if "/" in first or not first.endswith(".safetensors"):
        raise ValueError(f"filename_pattern {pattern!r} must name a .safetensors file in the capture directory")


def _prepare_directory(path: Path, pattern: str) -> None:
    if path.exists() and not path.is_dir():
        raise CaptureError(f"the capture path {path} is a file; pass a directory (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".clouseau-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise CaptureError(f"cannot write to the capture path {path}: {err.strerror or err}; pass a writable directory") from None
    _remove_previous_capture(path)


def _remove_previous_capture(path: Path) -> None:
    # A new capture replaces an old one in the same directory; files that are not a
    # capture's (no clouseau metadata) are left alone.
    from clouseau.store.reader import is_capture_file

    for file in path.iterdir():
        if file.name == STATUS_FILE or (file.name.startswith("graph-") and file.suffix == ".json"):
            file.unlink()
        elif file.suffix == ".safetensors" and is_capture_file(file):
            file.unlink()


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
