"""Where in the user's code a node was made: the innermost user frame of the stack, of a
formatted stack trace (torch.export's node meta) or of an exception.
"""

from __future__ import annotations

import inspect
import os
import re
import sysconfig
from types import FrameType

import torch

from clouseau.capture._common import user_frame
from clouseau.ir.graph import Source

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# All of clouseau, not only capture/: a frame of clouseau/api.py is not the user's line.
_CLOUSEAU_DIR = (
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    + os.sep
)
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep


def is_user_file(filename: str) -> bool:
    """Whether a frame in ``filename`` belongs to the user (not torch, clouseau or stdlib)."""
    return not (
        filename.startswith((_TORCH_DIR, _CLOUSEAU_DIR, _STDLIB_DIR))
        or filename.startswith("<")  # fx-generated code, <string>, <frozen ...>
    )


def source_from_stack(frame: FrameType | None = None) -> Source | None:
    """The innermost user frame of the current stack: the model line that made a node."""
    frame = frame if frame is not None else inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return Source(code.co_filename, frame.f_lineno, code.co_name, _line(frame))
        frame = frame.f_back
    return None


def _line(frame: FrameType) -> str:
    import linecache

    return linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()


_TRACE_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n(?:\s+(.*))?')


def source_from_stack_trace(stack_trace: str | None) -> Source | None:
    """The innermost user frame of a formatted stack trace (torch.export's node meta)."""
    if not stack_trace:
        return None
    found = None
    for match in _TRACE_LINE.finditer(stack_trace):
        if is_user_file(match.group(1)):
            found = match
    if found is None:
        return None
    return Source(
        found.group(1), int(found.group(2)), found.group(3), (found.group(4) or "").strip()
    )


def source_from_exception(error: BaseException) -> Source | None:
    """The innermost user frame in the traceback of ``error``."""
    frame = user_frame(error, lambda file: not is_user_file(file))
    if frame is None or frame.lineno is None:
        return None
    return Source(frame.filename, frame.lineno, frame.name, (frame.line or "").strip())
