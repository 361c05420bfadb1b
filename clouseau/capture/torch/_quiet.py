"""Silence torch.export while it serves as clouseau's fallback tracer.

Its failures are summed up in clouseau's TraceError; torch's own output would bury it:
warnings through ``logging`` (fake-tensor tracebacks, symbolic-shape guards) and the
partial graph that ``torch.export`` prints straight to ``sys.stderr`` when it fails.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_LOGGERS = (
    "torch.fx.experimental.symbolic_shapes",
    "torch._subclasses.fake_tensor",
    "torch.export",
    "torch._export",
)


class _OtherThreadsOnly:
    """A stand-in for ``sys.stderr`` that drops one thread's writes and forwards the rest."""

    def __init__(self, target: TextIO, thread: int) -> None:
        self._target = target
        self._thread = thread

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread:
            return len(text)
        return self._target.write(text)

    def flush(self) -> None:
        self._target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


@contextmanager
def quiet_export() -> Iterator[None]:
    """Drop torch's log records and this thread's stderr writes while the block runs.

    Runs under TRACE_LOCK (one trace at a time). Other threads' stderr still gets through.
    """
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    original = sys.stderr
    quiet = _OtherThreadsOnly(original, threading.get_ident())
    sys.stderr = quiet
    try:
        yield
    finally:
        if sys.stderr is quiet:  # unless someone else replaced it meanwhile
            sys.stderr = original
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


class _DropWhileQuiet(logging.Filter):
    """Drops records below ERROR logged in a thread inside :func:`quiet_dynamo`."""

    def __init__(self) -> None:
        super().__init__("clouseau-quiet")
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not getattr(self.local, "quiet", False)


_DROP = _DropWhileQuiet()


_SEEN = [-1]  # how many loggers existed at the last install


def _install() -> None:
    """Put the filter on the handlers torch gives its own loggers (they do not propagate:
    a filter on a logger would miss its children's records)."""
    loggers = logging.Logger.manager.loggerDict
    if len(loggers) == _SEEN[0]:
        return
    _SEEN[0] = len(loggers)
    for name, logger in list(loggers.items()):
        if not name.startswith("torch") or not isinstance(logger, logging.Logger):
            continue
        for handler in logger.handlers:
            if _DROP not in handler.filters:
                handler.addFilter(_DROP)


@contextmanager
def quiet_dynamo() -> Iterator[None]:
    """Drop TorchDynamo's warnings (graph breaks, recompilations) logged in this thread
    while the block runs: the dynamic tier compiles the model on the user's behalf, and
    its own warning names the tier and why. ERROR records still get through."""
    _install()
    local = _DROP.local
    outer = getattr(local, "quiet", False)
    local.quiet = True
    try:
        yield
    finally:
        local.quiet = outer
