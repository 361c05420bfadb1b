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
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class TraceLock:
    """Many runners, or one tracer; re-entrant per thread."""

    def __init__(self) -> None:
        # The condition's own lock, held directly on the run path: entering a run is then
        # one C-level acquire, not Condition.__enter__ (a run takes it twice a call).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._writer: int | None = None
        self._depth = 0
        self._readers = 0
        self._waiting = 0  # tracers waiting: new runs queue behind them (no starvation)
        self._local = threading.local()

    def _mine(self) -> int:
        return int(getattr(self._local, "readers", 0))

    def enter_shared(self) -> bool:
        """Start a run (waits while a trace runs or waits); False under torch.compile.

        Returns whether :meth:`exit_shared` must be called. The explicit pair, rather than
        :meth:`shared`, keeps a generator and two context managers off every call.
        """
        if _is_compiling():  # dynamo cannot trace a lock (and runs no fx)
            return False
        local = self._local
        with self._lock:
            mine = getattr(local, "readers", 0)
            busy = self._writer is not None or self._waiting
            # get_ident only when busy: a thread in a run or in its own trace goes on.
            if busy and not mine and self._writer != threading.get_ident():
                while self._writer is not None or self._waiting:
                    self._cond.wait()
            self._readers += 1
            local.readers = mine + 1
        return True

    def exit_shared(self) -> None:
        """End a run started by :meth:`enter_shared` (when it returned True)."""
        local = self._local
        with self._lock:
            self._readers -= 1
            local.readers -= 1
            if self._waiting:  # only a waiting tracer can be waiting for runs to end
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
        suspended = 0
        with self._cond:
            if self._writer == me:
                self._depth += 1
            else:
                # A thread inside a run (an instrumented model tracing a new signature
                # from its forward) gives its runs back while it traces, so two threads
                # doing so at once cannot wait for each other.
                suspended = self._mine()
                self._readers -= suspended
                self._local.readers = 0
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
                        self._readers += suspended
                        self._local.readers = suspended


_is_compiling = torch.compiler.is_compiling
TRACE_LOCK = TraceLock()
