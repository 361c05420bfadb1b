"""What every frontend does the same way: a call's bookkeeping in the sink, the check and the
description of a model's inputs, the error when a model rejects them, the user's frame.

Framework-free: each frontend passes what only it knows (how to describe one of its
values, which files are its library's).
"""

from __future__ import annotations

import inspect
import sysconfig
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from clouseau.ir.errors import ArgumentError
from clouseau.ir.sink import Sink

_STDLIB = sysconfig.get_paths()["stdlib"]


class SinkCall:
    """One call of the model in a sink: begun on entry (unless ``call`` is given), ended on
    a normal exit, failed (with the error, which propagates) on any other.

    >>> with SinkCall(sink) as call:
    ...     sink.put(call, graph_id, values)
    """

    __slots__ = ("call", "sink")

    def __init__(self, sink: Sink, call: int | None = None) -> None:
        self.sink = sink
        # The call is numbered before the model runs, so a run that raises is kept in
        # failed_calls (with why) and the calls keep the order they were made in.
        self.call = sink.begin_call() if call is None else call

    def __enter__(self) -> int:
        return self.call

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if error is None:
            self.sink.end_call(self.call)
        else:
            self.sink.fail_call(self.call, error)


def first_line(error: BaseException) -> str:
    """``TypeError: the first line of its message``: an error in one line of a message."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def describe_other(value: Any) -> str:
    """A value that is no array, for a message: its repr, or ``Type(...)`` when long."""
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__}(...)"


def describe_call(
    args: tuple[Any, ...], kwargs: dict[str, Any], describe: Callable[[Any], str]
) -> str:
    """``float32[2, 4], mask=bool[2]``: the inputs of a call, each through ``describe``."""
    return ", ".join(
        [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    )


def inputs_rejected(name: str, described: str, at: str, why: str, *, expects: str) -> str:
    """The message for a model that fails on the inputs it was traced with.

    ``described``: the inputs (:func:`describe_call`); ``at``: where in the user's code
    (`` at file:line (code)`` or ``""``); ``why``: the tracers' errors; ``expects``: what
    the model's inputs must fit besides its code (``"parameters"``, ``"weights"``).
    """
    return (
        f"cannot trace {name}: it fails on these inputs ({described}){at}{why}\n"
        "Fix: pass inputs the model accepts (the shapes, dtypes and types its code and "
        f"{expects} expect); each new input signature is traced anew and earlier calls "
        "are kept."
    )


def check_arguments(
    fn: Callable[..., Any],
    label: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    described: str,
) -> None:
    """Raise ArgumentError naming ``label``'s signature when ``fn`` cannot take the call.

    Without it, a wrong call fails deep inside a tracer with a misleading message.
    ``described`` is the frontend's short description of the arguments (shapes, dtypes).
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        raise ArgumentError(
            f"{label}{bare} cannot take the arguments ({described}): {error}. Call the "
            "instrumented model as you would call the model itself."
        ) from None


def user_frame(
    error: BaseException, is_library: Callable[[str], bool], *, or_stack: bool = False
) -> traceback.FrameSummary | None:
    """The innermost frame of ``error``'s traceback in the user's code (not a library's,
    ``is_library``, nor the standard library's); with ``or_stack``, when there is none, the
    innermost user frame of the current stack (where the user called the model)."""
    found = _innermost_user(traceback.extract_tb(error.__traceback__), is_library)
    if found is None and or_stack:
        found = _innermost_user(traceback.extract_stack(), is_library)
    return found


def _innermost_user(
    frames: traceback.StackSummary, is_library: Callable[[str], bool]
) -> traceback.FrameSummary | None:
    for frame in reversed(frames):
        if not (is_library(frame.filename) or frame.filename.startswith(_STDLIB)):
            return frame
    return None
