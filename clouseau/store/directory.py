"""The capture directory before writing: its path, its file names, and what it holds.

Checks that fail before anything is touched: a path that names a directory to create or
reuse, a file name pattern whose every name stays a plain file in it. What an earlier
capture may lose, and when, is :mod:`clouseau.store.location`'s.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from pathlib import Path

from clouseau.ir.errors import CaptureError
from clouseau.store.files import read_json
from clouseau.store.layout import DEFAULT_PATTERN, FORMAT, STATUS_FILE

_NAME_MAX = 255  # bytes in one file name on every common file system


def capture_path(path: str | os.PathLike[str]) -> Path:
    """The absolute capture directory for ``path``; CaptureError naming the fix if unusable."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if text == "":
        raise CaptureError(
            "path='' would write into the current directory; pass a directory name "
            "(e.g. '.clouseau'), or '.' to mean the current directory"
        )
    if "\0" in text:
        raise CaptureError(f"the capture path {text!r} contains a NUL character; remove it")
    # Absolute: the writer thread must not follow a later os.chdir of the program.
    where = Path(text).expanduser().absolute()
    long = [p for p in where.parts if len(os.fsencode(p)) > _NAME_MAX]
    if long:
        raise CaptureError(
            f"the capture path has a component of {len(os.fsencode(long[0]))} bytes "
            f"({long[0][:40]}...); file systems allow {_NAME_MAX}: pick a shorter name"
        )
    if where.is_symlink() and not where.exists():
        raise CaptureError(
            f"the capture path {where} is a symbolic link to {os.readlink(where)}, which does "
            "not exist: create that directory, or remove the link"
        )
    if where.exists() and not where.is_dir():
        raise CaptureError(
            f"the capture path {where} is a file; pass a directory (it is created if missing)"
        )
    return where


def max_bytes(max_size_mb: float) -> int:
    """``max_size_mb`` in bytes; TypeError or ValueError saying what is expected."""
    example = "a positive number of megabytes (e.g. 1024, or math.inf never to roll)"
    if isinstance(max_size_mb, bool) or not isinstance(max_size_mb, numbers.Real):
        raise TypeError(f"max_size_mb must be {example}; got {max_size_mb!r}")
    if not max_size_mb > 0:  # also rejects nan
        raise ValueError(f"max_size_mb must be {example}; got {max_size_mb!r}")
    limit = 2**63
    if math.isinf(max_size_mb) or max_size_mb >= limit / 2**20:
        return limit  # also 1e308: no file comes near either
    return max(1, int(max_size_mb * 2**20))


def check_pattern(pattern: str) -> frozenset[str]:
    """Check ``filename_pattern`` on the first 1000 indices (each later name at its write);
    return those names."""
    example = f"use e.g. {DEFAULT_PATTERN!r}"
    if not isinstance(pattern, str):
        raise TypeError(f"filename_pattern must be a str; got {pattern!r}; {example}")
    return _checked_pattern(pattern)


@functools.lru_cache(maxsize=64)
def _checked_pattern(pattern: str) -> frozenset[str]:
    # 1000 names cost ~40 ms: an instrument per generate or per batch pays it once.
    example = f"use e.g. {DEFAULT_PATTERN!r}"
    names = [file_name(pattern, i) for i in range(1000)]
    if len(set(names)) < len(names):
        raise ValueError(
            f"filename_pattern {pattern!r} has no {{idx}} field, so every rolled file would "
            f"overwrite the last; {example}"
        )
    return frozenset(names)


def file_name(pattern: str, idx: int) -> str:
    """The name of file ``idx``: ValueError unless it is a visible .safetensors file name."""
    example = f"use e.g. {DEFAULT_PATTERN!r}"
    try:
        name = pattern.format(idx=idx)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError, OverflowError) as err:
        raise ValueError(f"filename_pattern {pattern!r} is invalid ({err}); {example}") from None
    bad = next((c for c in name if ord(c) < 32 or ord(c) == 127), None)
    size = len(os.fsencode(name))
    problem = (
        "no '/' may appear in a file name (it would leave the capture directory)"
        if "/" in name or os.sep in name or (os.altsep and os.altsep in name)
        else f"no control character may appear in a file name (found {bad!r})"
        if bad is not None
        else "no leading '.' (a hidden file, or a directory)"
        if name.startswith(".")
        else f"a file name has at most {_NAME_MAX} bytes; this one has {size}"
        if size > _NAME_MAX
        else "the name must end with .safetensors"
        if not name.endswith(".safetensors")
        else ""
    )
    if problem:
        raise ValueError(
            f"filename_pattern {pattern!r} gives the file name {name!r} at index {idx}: "
            f"{problem}; {example}"
        )
    return name


def read_status(path: Path) -> dict[str, object] | None:
    """The status.json of ``path``, or None when there is none (CaptureError if damaged)."""
    file = path / STATUS_FILE
    if not os.path.lexists(file):
        return None
    status = read_json(file)
    if not isinstance(status, dict) or status.get("format") != FORMAT:
        raise CaptureError(f"{file} is damaged: not a clouseau status file")
    return status
