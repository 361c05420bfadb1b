"""The capture store: safetensors files, written atomically and rolled at a size limit."""

from __future__ import annotations

import os

from clouseau.store.capture import AmbiguousPointError, Capture, Record
from clouseau.store.reader import load
from clouseau.store.writer import DirectorySink, MemorySink


def open_sink(
    path: str | os.PathLike[str] | None, max_size_mb: float, filename_pattern: str
) -> DirectorySink | MemorySink:
    """A sink writing to the directory ``path``, or an in-memory one when ``path`` is None."""
    if path is None:
        return MemorySink()
    return DirectorySink(path, max_size_mb=max_size_mb, filename_pattern=filename_pattern)


__all__ = ["AmbiguousPointError", "Capture", "DirectorySink", "MemorySink", "Record", "load", "open_sink"]
