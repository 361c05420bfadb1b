"""One process-wide lock between tracing a torch model and running lowered graphs.

torch.fx (and torch.export's non-strict tracer) patch ``torch.nn.Module.__call__`` and
``__getattr__`` for the whole process while they trace. A GraphModule running in another
thread at that moment calls its submodules through the patched methods and records into
the trace (or fails with "module is not installed as a submodule"), and two traces at once
corrupt each other's patches and fake-tensor state. So a trace runs alone (``exclusive``),
while any number of instrumented calls run together (``shared``). Both are re-entrant in
one thread: a trace may call an instrumented model (its first call traces in turn), and a
run may trace (its shared hold is given back meanwhile, then taken again).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class _Runs:
    """One thread's count of the runs it is inside (a trace may nest runs in turn)."""

    __slots__ = ("__weakref__", "count")

    def __init__(self) -> None:
        self.count = 0


class TraceLock:
    """Many runners, or one tracer; re-entrant per thread.

    A run takes no lock when no trace runs or waits: it counts itself in its own thread's
    record, then looks for a tracer; a tracer announces itself, then sums the records.
    Under the GIL one of the two sees the other (Python's operations are sequentially
    consistent there), so a run that sees no tracer is counted by any tracer after it,
    and one that sees a tracer steps back and waits on the condition.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._writer: int | None = None
        self._depth = 0
        self._waiting = 0  # tracers waiting: new runs queue behind them (no starvation)
        self._local = threading.local()
        self._threads: weakref.WeakSet[_Runs] = weakref.WeakSet()  # a record per thread

    @property
    def _readers(self) -> int:
        """The runs open in every thread (the tracer reads it under the lock)."""
        return sum(runs.count for runs in tuple(self._threads))

    def _mine(self) -> int:
        return self._runs().count

    def _runs(self) -> _Runs:
        runs = getattr(self._local, "runs", None)
        if runs is None:
            runs = self._local.runs = _Runs()
            with self._lock:
                self._threads.add(runs)
        return runs

    def enter_shared(self) -> bool:
        """Start a run (waits while a trace runs or waits); False under torch.compile.

        Returns whether :meth:`exit_shared` must be called. The explicit pair, rather than
        :meth:`shared`, keeps a generator and two context managers off every call.
        """
        if _is_compiling():  # dynamo cannot trace a lock (and runs no fx)
            return False
        try:
            runs = self._local.runs
        except AttributeError:
            runs = self._runs()
        runs.count += 1
        if self._writer is not None or self._waiting:
            self._wait_turn(runs)
        return True

    def _wait_turn(self, runs: _Runs) -> None:
        # A thread in a run or in its own trace goes on; another steps back, lets a
        # tracer that counted it go, and counts itself again once no trace runs or waits.
        if runs.count > 1 or self._writer == threading.get_ident():
            return
        with self._lock:
            runs.count -= 1
            self._cond.notify_all()
            while self._writer is not None or self._waiting:
                self._cond.wait()
            runs.count += 1

    def exit_shared(self) -> None:
        """End a run started by :meth:`enter_shared` (when it returned True)."""
        self._local.runs.count -= 1
        if self._waiting:  # only a waiting tracer can be waiting for runs to end
            with self._lock:
                self._cond.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        entered = self.enter_shared()
        try:
            yield
        finally:
            if entered:
                self.exit_shared()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if _is_compiling():
            yield
            return
        me = threading.get_ident()
        runs = self._runs()  # before the lock, which a thread's first record takes
        suspended = 0
        with self._cond:
            if self._writer == me:
                self._depth += 1
            else:
                # A thread inside a run (an instrumented model tracing a new signature
                # from its forward) gives its runs back while it traces, so two threads
                # doing so at once cannot wait for each other.
                suspended, runs.count = runs.count, 0
                self._waiting += 1
                try:
                    self._cond.notify_all()
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                self._writer, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._writer = None
                    self._cond.notify_all()
                if suspended:
                    try:
                        while self._writer is not None:  # another trace got in: let it end
                            self._cond.wait()
                    finally:
                        runs.count = suspended


_is_compiling = torch.compiler.is_compiling
TRACE_LOCK = TraceLock()
