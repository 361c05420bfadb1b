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
        self._cond = threading.Condition(threading.Lock())
        self._writer: int | None = None
        self._depth = 0
        self._readers = 0
        self._waiting = 0  # tracers waiting: new runs queue behind them (no starvation)
        self._local = threading.local()

    def _mine(self) -> int:
        return int(getattr(self._local, "readers", 0))

    @contextmanager
    def shared(self) -> Iterator[None]:
        if torch.compiler.is_compiling():  # dynamo cannot trace a lock (and runs no fx)
            yield
            return
        me = threading.get_ident()
        with self._cond:
            if self._writer != me and not self._mine():
                while self._writer is not None or self._waiting:
                    self._cond.wait()
            self._readers += 1
            self._local.readers = self._mine() + 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._local.readers = self._mine() - 1
                if self._waiting:  # only a waiting tracer can be waiting for runs to end
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if torch.compiler.is_compiling():
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


TRACE_LOCK = TraceLock()
