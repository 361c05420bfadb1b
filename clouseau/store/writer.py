"""Sinks: where an instrumented model's saved values go (a directory, or memory).

:class:`DirectorySink` buffers arrays until the next one would push the file past
``max_size_mb`` (header included), then hands the full file to a writer thread so disk I/O
overlaps the next forward pass. At most one file is being written while the next one
fills, so memory stays under about twice ``max_size_mb``; ``put`` blocks only when a full
file waits for the one before it. ``flush`` writes the last, partly filled file in the
calling thread, which waits for it anyway. Each file is written under a temporary name and
renamed when complete; an array is never split. The IR of each traced signature is written as
``graph-NNN.json`` and the state of the calls (which failed, and why) as ``status.json``,
both atomically.
"""

from __future__ import annotations

import atexit
import json
import math
import numbers
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue
from clouseau.store.capture import Capture, Entry, Record, encode_record, tensor_key
from clouseau.store.safetensors_io import (
    dtype_code,
    entry_cost,
    header_overhead,
    storable,
    write_file,
)

STATUS_FILE = "status.json"
GRAPH_PATTERN = "graph-{:03d}.json"
FORMAT = "clouseau.capture/1"
DEFAULT_PATTERN = "activations-{idx:03d}.safetensors"
# Temporary files of write_file and _write_json, and the writability probe: clouseau's own.
_TEMP = re.compile(
    r"\.(?:.+\.safetensors|status\.json|graph-\d+\.json)\.\d+\.tmp|\.clouseau-probe-\d+"
)


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
        self.check_open()
        call, self.next_call = self.next_call, self.next_call + 1
        self.order[call] = 0
        return call

    def records(
        self, call: int, graph_id: int, values: Sequence[SavedValue]
    ) -> list[tuple[Record, np.ndarray]]:
        self.check_open()
        arrays = [np.asarray(value.array) for value in values]
        for array in arrays:
            dtype_code(array.dtype)  # reject unstorable dtypes before anything is numbered
        out = []
        for value, array in zip(values, arrays, strict=True):
            order = self.order.get(call, 0)
            self.order[call] = order + 1
            names, index = tuple(value.names), tuple(int(i) for i in value.index)
            key = tensor_key(names[0], call, index)
            record = Record(key, names, value.node, call, order, graph_id, index)
            out.append((record, array))
        return out

    def check_open(self) -> None:
        if self.closed:
            raise CaptureError(
                "this capture is closed: create a new instrumented model to capture again"
            )


class MemorySink:
    """Keeps everything in memory (``instrument(..., path=None)``).

    Arrays are stored as the files would hold them (little-endian, C-contiguous) and handed
    out read-only, so that reading a capture never changes it.
    """

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
            for record, array in self._calls.records(call, graph_id, values):
                view = storable(array).view()
                view.flags.writeable = False
                self._items.append((record, view))

    def end_call(self, call: int) -> None:
        pass

    def fail_call(self, call: int, error: BaseException) -> None:
        with self._calls.lock:
            self._calls.failed[call] = _describe(error)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        with self._calls.lock:
            self._calls.closed = True

    def capture(self) -> Capture:
        with self._calls.lock:
            entries = tuple(Entry(r, _loader(a)) for r, a in self._items)
            return Capture(entries, tuple(self._calls.graphs), self._calls.failed)


def _loader(array: np.ndarray) -> Callable[[], np.ndarray]:
    return lambda: array


@dataclass(frozen=True)
class _Job:
    """One file to write: its final path and its arrays with their records."""

    path: Path
    items: tuple[_Item, ...]


# A buffered array: its record, the array, and the record already encoded as JSON.
_Item = tuple[Record, np.ndarray, str]


class DirectorySink:
    """Writes rolling safetensors files into a capture directory.

    Parameters
    ----------
    path
        The capture directory; created if missing. An earlier capture in it (clouseau's
        own files only: its safetensors files, ``graph-*.json``, ``status.json`` and
        temporary files) is removed.
    max_size_mb
        Files roll over before the next array would make them larger than this; an array
        larger than the limit gets a file of its own. ``math.inf`` never rolls.
    filename_pattern
        The file names, with an ``{idx}`` field numbering the rolled files.

    Raises
    ------
    TypeError, ValueError
        A bad ``max_size_mb`` or ``filename_pattern`` (the message says what is expected).
    CaptureError
        ``path`` is a file or cannot be written.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_size_mb: float = 1024,
        filename_pattern: str = DEFAULT_PATTERN,
    ) -> None:
        self.max_bytes = _max_bytes(max_size_mb)
        _check_pattern(filename_pattern)
        # Absolute: the writer thread must not follow a later os.chdir of the program.
        self.path = Path(path).absolute()
        self.filename_pattern = filename_pattern
        _prepare_directory(self.path)
        self._calls = _Calls()
        self._overhead = header_overhead({"format": FORMAT, "clouseau": "[]"})
        self._buffer: list[_Item] = []
        self._buffer_bytes = self._overhead
        self._buffer_keys: set[str] = set()
        self._file_index = 0
        self._error: BaseException | None = None
        # The writer thread takes one job at a time; the condition hands it over.
        self._cv = threading.Condition()
        self._job: _Job | None = None
        self._stopping = False
        self._write_status()
        self._thread = threading.Thread(
            target=self._write_loop, name=f"clouseau-writer:{self.path}", daemon=True
        )
        self._thread.start()
        # A weak reference, so that registering at exit does not keep the sink alive.
        self._atexit = partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit)

    # -- the Sink protocol -------------------------------------------------------------
    def add_graph(self, graph: Graph) -> int:
        with self._calls.lock:
            self._calls.check_open()
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
                if record.key in self._buffer_keys:
                    # The same name, call and index twice (a point saved twice in one
                    # call): the order makes the key unique within the file.
                    record = replace(record, key=f"{record.key}~{record.order}")
                encoded = encode_record(record)
                cost = self._cost(record, array, encoded)
                if self._buffer and self._buffer_bytes + cost > self.max_bytes:
                    self._submit()
                self._buffer.append((record, array, encoded))
                self._buffer_keys.add(record.key)
                self._buffer_bytes += cost

    def end_call(self, call: int) -> None:
        pass

    def fail_call(self, call: int, error: BaseException) -> None:
        with self._calls.lock:
            self._calls.failed[call] = _describe(error)
            self._write_status()

    def flush(self) -> None:
        with self._calls.lock:
            with self._cv:
                while self._job is not None:  # a full file handed over before this one
                    self._cv.wait()
            # This thread writes the last file itself: it must wait for it anyway, and
            # the hand-off to the writer thread and back (two thread switches and a cold
            # cache) cost about 0.2-0.5 ms, a sixth of writing a 2 MiB file.
            if self._buffer:
                self._write_buffer()
            self._raise_writer_error()

    def close(self) -> None:
        with self._calls.lock:
            if self._calls.closed:
                return
            try:
                self.flush()
            finally:
                # Interrupted in flush (Ctrl-C), the buffer is still here: the writer
                # thread writes it before it stops.
                self._submit()
                self._calls.closed = True
                with self._cv:
                    self._stopping = True
                    self._cv.notify_all()
                self._thread.join()
                atexit.unregister(self._atexit)
                self._write_status()

    def capture(self) -> Capture:
        self.flush()
        from clouseau.store.reader import load

        return load(self.path)

    # -- internals ---------------------------------------------------------------------
    def _cost(self, record: Record, array: np.ndarray, encoded: str) -> int:
        # Data plus an upper bound on its header: the record (escaped again inside the
        # metadata string) and the tensor entry. Offsets in a file that keeps to the limit
        # have at most the digits of max_bytes; a file over it holds one array anyway.
        escaped = len(encode_basestring_ascii(encoded)) - 1  # minus quotes, plus a comma
        entry = entry_cost(record.key, array.dtype, array.shape, self.max_bytes)
        return array.nbytes + escaped + entry

    def _next_job(self) -> _Job:
        path = self.path / self.filename_pattern.format(idx=self._file_index)
        return _Job(path, tuple(self._buffer))

    def _next_file(self) -> None:
        self._file_index += 1
        self._buffer, self._buffer_keys, self._buffer_bytes = [], set(), self._overhead

    def _submit(self) -> None:
        if not self._buffer:
            return
        job = self._next_job()
        with self._cv:
            while self._job is not None:  # the file before is still being written
                self._cv.wait()
            self._job = job
            self._cv.notify_all()
        # Only once the job is handed over: an interrupt above loses nothing.
        self._next_file()

    def _write_buffer(self) -> None:
        """Write the buffer in this thread (the writer thread is idle; the lock is held)."""
        if self._error is None:
            try:
                _write_job(self._next_job())
            except Exception as err:  # reported as the writer thread's errors are
                self._error = err
            # An interrupt (BaseException) propagates with the buffer kept: close() then
            # hands it to the writer thread, so nothing put is lost.
        self._next_file()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._stopping:
                    self._cv.wait()
                if self._job is None:
                    return
                job = self._job
            try:
                if self._error is None:
                    _write_job(job)
            except BaseException as err:  # reported to the caller at the next put/flush/close
                self._error = err
            finally:
                with self._cv:
                    self._job = None
                    self._cv.notify_all()

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            err = self._error
            raise CaptureError(
                f"writing the capture to {self.path} failed: {err}. Nothing more is written; "
                "the files written before are complete and load with clouseau.load."
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
        except CaptureError as err:
            if self._error is None:
                self._error = err


def _write_job(job: _Job) -> None:
    records = "[" + ",".join(e for _, _, e in job.items) + "]"
    metadata = {"format": FORMAT, "clouseau": records}
    write_file(job.path, [(r.key, a) for r, a, _ in job.items], metadata)


def _close_at_exit(ref: weakref.ref[DirectorySink]) -> None:
    # An unclosed capture is completed at interpreter exit; a failure is reported in one
    # line, not as a traceback from inside atexit.
    sink = ref()
    if sink is None:
        return
    try:
        sink.close()
    except CaptureError as err:
        print(f"clouseau: {err}", file=sys.stderr)


def _max_bytes(max_size_mb: float) -> int:
    example = "a positive number of megabytes (e.g. 1024, or math.inf never to roll)"
    if isinstance(max_size_mb, bool) or not isinstance(max_size_mb, numbers.Real):
        raise TypeError(f"max_size_mb must be {example}; got {max_size_mb!r}")
    if not max_size_mb > 0:  # also rejects nan
        raise ValueError(f"max_size_mb must be {example}; got {max_size_mb!r}")
    if math.isinf(max_size_mb):
        return 2**63
    return max(1, int(max_size_mb * 2**20))


def _check_pattern(pattern: str) -> None:
    example = f"use e.g. {DEFAULT_PATTERN!r}"
    if not isinstance(pattern, str):
        raise TypeError(f"filename_pattern must be a str; got {pattern!r}; {example}")
    try:
        names = [pattern.format(idx=i) for i in range(1000)]
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as err:
        raise ValueError(f"filename_pattern {pattern!r} is invalid ({err}); {example}") from None
    if len(set(names)) < len(names):
        raise ValueError(
            f"filename_pattern {pattern!r} has no {{idx}} field, so every rolled file would "
            f"overwrite the last; {example}"
        )
    if any(sep in pattern for sep in ("/", os.sep)) or names[0].startswith("."):
        raise ValueError(
            f"filename_pattern {pattern!r} must name a visible file in the capture directory "
            f"(no '/', no leading '.'); {example}"
        )
    if not names[0].endswith(".safetensors"):
        raise ValueError(f"filename_pattern {pattern!r} must end with .safetensors; {example}")


def _prepare_directory(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise CaptureError(
            f"the capture path {path} is a file; pass a directory (it is created if missing)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".clouseau-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise CaptureError(
            f"cannot write to the capture path {path}: {err.strerror or err}; "
            "pass a writable directory"
        ) from None
    _remove_previous_capture(path)


def _remove_previous_capture(path: Path) -> None:
    # A new capture replaces an old one in the same directory. Only clouseau's own files
    # go: safetensors files with clouseau metadata, graph/status JSON, and temporary files
    # left by an interrupted writer. Any other file is left alone.
    from clouseau.store.reader import is_capture_file

    for file in path.iterdir():
        name = file.name
        if not file.is_file():
            continue
        if (
            name == STATUS_FILE
            or re.fullmatch(r"graph-\d+\.json", name)
            or _TEMP.fullmatch(name)
            or (name.endswith(".safetensors") and is_capture_file(file))
        ):
            try:
                file.unlink()
            except OSError as err:
                raise CaptureError(
                    f"cannot remove {file} of an earlier capture: {err.strerror or err}; "
                    "remove it, or pick another path"
                ) from None


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and not isinstance(err, CaptureError):
            raise CaptureError(f"cannot write {path}: {err.strerror or err}") from err
        raise


def _describe(error: BaseException) -> str:
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
