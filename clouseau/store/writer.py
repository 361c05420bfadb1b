"""The directory sink: rolling safetensors files written by a thread of their own.

:class:`DirectorySink` buffers arrays until the next one would push the file past
``max_size_mb`` (header included), or until the buffer is ``flush_s`` seconds old, then
hands the file to a writer thread so disk I/O overlaps the next forward pass. At most one
file is being written while the next one fills, so memory stays under about twice
``max_size_mb``; ``put`` blocks only when a full file waits for the one before it.
``flush`` writes the last, partly filled file in the calling thread, which waits for it
anyway. Each file is created exclusively under an unpredictable temporary name and renamed
into place without replacing anything; an array is never split.

What a crash can lose is bounded: the calls of the last ``flush_s`` seconds (and those of
the file being written). Each file lists the calls that continue after it (``open``) and
those of earlier files that ended since (``done``), so a reader knows which calls are
whole; ``status.json`` (calls made, files written, calls failed or lost, closed or not) is
rewritten at most every ``flush_s`` seconds and at close.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue
from clouseau.store.capture import Record, encode_record
from clouseau.store.directory import file_name, read_status
from clouseau.store.files import write_bytes, write_json
from clouseau.store.jobs import Item, Job, metadata, probe, span
from clouseau.store.layout import DEFAULT_PATTERN, FORMAT, STATUS_FILE, graph_file
from clouseau.store.location import check_clashes, previous_files, remove_previous
from clouseau.store.lock import DirectoryLock
from clouseau.store.memory import Calls, check_saved_dtypes, describe
from clouseau.store.safetensors_io import entry_cost, header_overhead, write_file

__all__ = ["FLUSH_S", "Core"]

FLUSH_S = 2.0  # the default bound, in seconds, on what a crash can lose
# Arrays per file: a file is cut at the end of the call that reaches this many (and inside
# a call at four times as many). Writing a file costs per array as well as per byte: small
# calls made fast (50,000 a second) buffered 100,000 arrays per flush_s, whose file took
# seconds to write while the calls went on, so under CPU load the first file landed after
# the kill that the flush_s bound promises to survive (and a header grows past the
# 100 MiB that safetensors reads). Cut at this count, files land steadily and each one is
# written in a fraction of flush_s.
ARRAYS_PER_FILE = 8192


class Core:
    """The state of a directory sink, shared with its writer thread (which must not hold
    the :class:`DirectorySink`, or a dropped model would never be collected)."""

    def __init__(
        self, path: Path, limit: int, pattern: str, flush_s: float, names: frozenset[str]
    ) -> None:
        self.path, self.max_bytes, self.pattern, self.flush_s = path, limit, pattern, flush_s
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._dirlock = DirectoryLock(path)
        except CaptureError:
            raise
        except OSError as err:
            raise CaptureError(
                f"cannot write to the capture path {path}: {err.strerror or err}; "
                "pass a writable directory"
            ) from None
        try:
            # Read under the lock; removed only at the first trace (_start).
            self._previous = previous_files(path)
            check_clashes(path, names, self._previous)
            probe(path)
        except BaseException:
            self._dirlock.release()
            raise
        self._calls = Calls()
        self._started = self._forked = False
        self._overhead = header_overhead(metadata("[]", (), ()))
        self._buffer: list[Item] = []
        self._buffer_bytes = self._overhead
        self._buffer_keys: set[str] = set()
        self._buffer_calls: set[int] = set()
        self._buffer_since = 0.0
        self._file_index = 0
        self._names: dict[str, int] = {}  # file name -> index, to catch a pattern's repeats
        self._written: list[str] = []  # files renamed into place (the writer thread appends)
        self._active: set[int] = set()  # calls begun and not ended
        self._open_on_disk: set[int] = set()  # calls cut by a file and not ended since
        self._done_pending: set[int] = set()
        self._done: set[int] = set()
        self._lost: dict[int, str] = {}
        self._status_at = 0.0
        self._status_lock = threading.Lock()
        self._error: BaseException | None = None
        self._unwritten: set[int] = set()  # the calls of files that failed to be written
        self._cv = threading.Condition()
        self._job: Job | None = None
        self._stopping = False
        self._thread = threading.Thread(
            target=self._write_loop, name=f"clouseau-writer:{path}", daemon=True
        )
        self._thread.start()
        _LIVE.add(self)

    # -- the Sink protocol -------------------------------------------------------------
    def add_graph(self, graph: Graph) -> int:
        check_saved_dtypes(graph)
        with self._calls.lock:
            self._check()
            self._start()
            graph_id = len(self._calls.graphs)
            # The file first: a graph id is handed out only once its file is written.
            file = self.path / graph_file(graph_id)
            try:
                write_bytes(file, graph_json(graph), replace=False)
            except FileExistsError:
                raise CaptureError(
                    f"cannot write {file}: a file of that name appeared in the capture "
                    "directory while it was written; remove it and run again"
                ) from None
            except OSError as err:
                raise CaptureError(f"cannot write {file}: {err.strerror or err}") from err
            self._calls.graphs.append(graph)
            return graph_id

    def begin_call(self) -> int:
        with self._calls.lock:
            self._check()
            self._start()
            call = self._calls.begin()
            self._active.add(call)
            return call

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        with self._calls.lock:
            self._check()
            self._start()
            self._raise_writer_error()
            if not self._buffer:
                self._buffer_since = time.monotonic()
            for record, array in self._calls.records(call, graph_id, values):
                if record.key in self._buffer_keys:
                    # The same name, call and index twice (a point saved twice in one
                    # call): the order makes the key unique within the file.
                    record = replace(record, key=f"{record.key}~{record.order}")
                encoded = encode_record(record)
                cost = self._cost(record, array, encoded)
                full = len(self._buffer) >= 4 * ARRAYS_PER_FILE
                if self._buffer and (full or self._buffer_bytes + cost > self.max_bytes):
                    self._submit()
                if call not in self._buffer_calls:
                    self._buffer_calls.add(call)
                    cost += len(str(call)) + 1  # its place in the file's "open" list
                self._buffer.append((record, array, encoded))
                self._buffer_keys.add(record.key)
                self._buffer_bytes += cost
            # Calls are cut at their end (end_call) once the buffer is flush_s old; a
            # call that runs longer than that is cut inside, as marked open.
            if time.monotonic() - self._buffer_since > 2 * self.flush_s:
                self._submit()
            self._raise_writer_error()

    def end_call(self, call: int) -> None:
        with self._calls.lock:
            self._ended(call)
            old = time.monotonic() - self._buffer_since > self.flush_s
            if self._buffer and (old or len(self._buffer) >= ARRAYS_PER_FILE):
                self._submit()

    def fail_call(self, call: int, error: BaseException) -> None:
        if self._forked:
            return
        with self._calls.lock:
            self._calls.failed[call] = describe(error)
            self._ended(call)
            self._write_status(force=True)  # rare, and worth knowing at once

    def flush(self) -> None:
        if self._forked:
            return
        with self._calls.lock:
            with self._cv:
                while self._job is not None:  # a full file handed over before this one
                    self._cv.wait()
            # This thread writes the last file itself: it must wait for it anyway, and
            # the hand-off to the writer thread and back (two thread switches and a cold
            # cache) cost about 0.2-0.5 ms, a sixth of writing a 2 MiB file.
            job = self._cut()
            if job is not None:
                self._run(job)
            self._raise_writer_error()

    def close(self) -> None:
        if self._forked:
            return
        with self._calls.lock:
            if self._calls.closed:
                return
            # Nothing more can be put: what a call still running put is all it will have.
            for call in sorted(self._active):
                self._ended(call)
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
                self._finish()

    def abandon(self) -> None:
        """Stop without writing: for a sink given up before anything was put (a refused
        run of several processes, a failed ``instrument``), which must leave the
        directory as it found it. Once started, it closes as usual."""
        if self._started:
            self.close()
            return
        with self._calls.lock:
            self._calls.closed = True
            with self._cv:
                self._stopping = True
                self._cv.notify_all()
        self._thread.join()
        self._dirlock.release()

    def close_quietly(self) -> None:
        """Close at interpreter exit or when dropped; a failure is one line on stderr."""
        try:
            self.close()
        except CaptureError as err:
            import sys

            print(f"clouseau: {err}", file=sys.stderr)

    # -- internals ---------------------------------------------------------------------
    def _check(self) -> None:
        if self._forked:
            raise CaptureError(
                "this instrumented model writes its capture from the process that created "
                "it; a forked child cannot add to it: instrument the model in the child, "
                "with a path of its own"
            )
        self._calls.check_open()

    def _start(self) -> None:
        # The earlier capture goes only now, once the new one has traced: a typo in
        # select or a bad input leaves it as it was.
        if not self._started:
            remove_previous(self.path, self._previous)
            self._started = True
            self._write_status(force=True)

    def _finish(self) -> None:
        try:
            if not self._started and read_status(self.path) is None:
                self._start()  # an empty capture is still a capture
            self._write_status(force=True)
        finally:
            self._dirlock.release()

    def _ended(self, call: int) -> None:
        self._active.discard(call)
        if call in self._open_on_disk:
            self._open_on_disk.discard(call)
            self._done_pending.add(call)
            self._buffer_bytes += len(str(call)) + 1

    def _cost(self, record: Record, array: np.ndarray, encoded: str) -> int:
        # Data plus an upper bound on its header: the record (escaped again inside the
        # metadata string) and the tensor entry. Offsets in a file that keeps to the limit
        # have at most the digits of max_bytes; a file over it holds one array anyway.
        escaped = len(encode_basestring_ascii(encoded)) - 1  # minus quotes, plus a comma
        entry = entry_cost(record.key, array.dtype, array.shape, self.max_bytes)
        return array.nbytes + escaped + entry

    def _cut(self) -> Job | None:
        """The buffer as a job for the next file (None if empty, or if the capture stopped);
        the buffer starts afresh."""
        if not self._buffer or self._error is not None:
            return None
        try:
            name = self._next_name()
        except CaptureError as err:  # raised to the caller as a writer error
            self._failed(err, None)
            return None
        open_calls = tuple(sorted(self._buffer_calls & self._active))
        self._open_on_disk.update(open_calls)
        done = tuple(sorted(self._done_pending))
        self._done.update(done)
        calls = frozenset(self._buffer_calls)
        job = Job(self.path / name, tuple(self._buffer), open_calls, done, calls)
        self._file_index += 1
        self._buffer, self._buffer_keys, self._buffer_calls = [], set(), set()
        self._buffer_bytes = self._overhead
        self._buffer_since = time.monotonic()
        self._done_pending = set()
        return job

    def _next_name(self) -> str:
        index = self._file_index
        try:
            name = file_name(self.pattern, index)
        except ValueError as err:
            raise CaptureError(str(err)) from None
        if name in self._names:
            raise CaptureError(
                f"filename_pattern {self.pattern!r} gives {name!r} for files "
                f"{self._names[name]} and {index}: a file would be overwritten. Use a "
                f"pattern with one name per index, e.g. {DEFAULT_PATTERN!r}"
            )
        self._names[name] = index
        return name

    def _submit(self) -> None:
        job = self._cut()
        if job is None:
            return
        with self._cv:
            while self._job is not None:  # the file before is still being written
                self._cv.wait()
            self._job = job
            self._cv.notify_all()

    def _run(self, job: Job, *, in_writer: bool = False) -> None:
        # A job handed over before an error elsewhere is still written: its calls are
        # whole, and writing them loses nothing.
        try:
            _write_job(job)
            self._written.append(job.path.name)
        except Exception as err:  # reported to the caller at the next put/flush/close
            self._failed(err, job)
        except BaseException as err:
            if in_writer:
                self._failed(err, job)
                return
            # An interrupt in the caller's thread: the writer thread gets this job, so
            # nothing put is lost.
            with self._cv:
                self._job = job
                self._cv.notify_all()
            raise

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                if self._job is None and not self._stopping:
                    self._cv.wait(self.flush_s / 4)
                if self._job is None and self._stopping:
                    return
                job = self._job
            if job is None:
                self._tick()
                continue
            try:
                self._run(job, in_writer=True)
            finally:
                with self._cv:
                    self._job = None
                    self._cv.notify_all()
            self._write_status()

    def _tick(self) -> None:
        """An idle writer thread writes a buffer older than ``flush_s``, and the status."""
        if self._calls.closed or self._forked:
            return
        age = time.monotonic() - self._buffer_since if self._buffer else 0.0
        # A call still running is left to its end_call (which cuts then), unless it runs
        # long; a caller that holds the lock checks the age itself.
        running = bool(self._buffer_calls & self._active)
        old = age > 2 * self.flush_s or (age > self.flush_s and not running)
        if old and self._calls.lock.acquire(timeout=0.05):
            try:
                if not self._calls.closed:
                    self._submit()
            finally:
                self._calls.lock.release()
        self._write_status()

    def _failed(self, err: BaseException, job: Job | None) -> None:
        # Either thread; the first error is the one reported, every failed job's calls
        # are lost.
        with self._cv:
            if job is not None:
                self._unwritten.update(job.calls)
            if self._error is None:
                self._error = err

    def _raise_writer_error(self) -> None:
        if self._error is None:
            return
        err = self._error
        with self._cv:
            while self._job is not None:  # a file handed over fails (or not) first
                self._cv.wait()
            lost = self._unwritten | self._buffer_calls
        if lost - self._lost.keys():
            reason = f"not on disk: writing the capture failed ({err})"
            self._lost.update({c: reason for c in sorted(lost) if c not in self._lost})
            self._buffer, self._buffer_keys, self._buffer_calls = [], set(), set()
            self._write_status(force=True)
        if not self._calls.stopped:
            self._calls.stopped = (
                f"writing the capture to {self.path} failed: {err}. The capture stopped: "
                "nothing more is written (this call and every later one raise this error); "
                f"call(s) {span(lost)} are not on disk; the files written before are "
                "complete and load with clouseau.load. Create a new instrumented model "
                "to capture again"
            )
        raise CaptureError(self._calls.stopped) from err

    def _write_status(self, force: bool = False) -> None:
        """Rewrite status.json (at most every ``flush_s`` seconds unless ``force``).

        Either thread, without the calls lock: every field is read through one C-level
        copy (atomic under the GIL), and the status lock orders the writes.
        """
        if not self._started:
            return
        with self._status_lock:
            now = time.monotonic()
            if not force and now - self._status_at <= self.flush_s:
                return
            self._status_at = now
            calls = self._calls
            status = {
                "format": FORMAT,
                "calls": calls.next_call,
                "closed": calls.closed,
                "failed_calls": {str(k): v for k, v in sorted(dict(calls.failed).items())},
                "lost_calls": {str(k): v for k, v in sorted(dict(self._lost).items())},
                "files": list(self._written),
                "pattern": self.pattern,
                "graphs": len(calls.graphs),
                "done": sorted(self._done | self._done_pending),
                "pid": os.getpid(),
            }
            try:
                write_json(self.path / STATUS_FILE, status, replace=True)
            except OSError as err:
                if self._error is None:
                    self._error = CaptureError(f"cannot write {STATUS_FILE}: {err.strerror or err}")


def _write_job(job: Job) -> None:
    records = "[" + ",".join(e for _, _, e in job.items) + "]"
    arrays = [(r.key, a) for r, a, _ in job.items]
    write_file(job.path, arrays, metadata(records, job.open, job.done), True)


_LIVE: weakref.WeakSet[Core] = weakref.WeakSet()
# The JSON of the last graphs written, by graph object: a new instrumented model of a model
# seen before writes the very graph an earlier one did (capture/torch/runtime/reuse.py), and
# encoding it again was an eighth of a `with instrument(..., path=DIR)` on the quickstart.
_GRAPH_JSON: OrderedDict[int, tuple[weakref.ref[Graph], bytes]] = OrderedDict()
_GRAPH_JSON_LOCK = threading.Lock()


def graph_json(graph: Graph) -> bytes:
    """``graph.to_json()`` as JSON bytes, encoded once per graph object (the last 16)."""
    with _GRAPH_JSON_LOCK:
        found = _GRAPH_JSON.get(id(graph))
        if found is not None and found[0]() is graph:  # ids are reused after a free
            _GRAPH_JSON.move_to_end(id(graph))
            return found[1]
    data = json.dumps(graph.to_json()).encode()
    with _GRAPH_JSON_LOCK:
        _GRAPH_JSON[id(graph)] = (weakref.ref(graph), data)
        while len(_GRAPH_JSON) > 16:
            _GRAPH_JSON.popitem(last=False)
    return data


def _after_fork_in_child() -> None:
    # The child has a copy of every sink but no writer thread, and possibly a lock held
    # by a parent thread at the fork: it must never touch the parent's capture.
    for core in list(_LIVE):
        core._forked = True
        core._dirlock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
