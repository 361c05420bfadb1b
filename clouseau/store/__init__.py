"""The capture store: safetensors files, written atomically and rolled at a size limit."""

from __future__ import annotations

import os

from clouseau.store.capture import AmbiguousPointError, Capture, Record
from clouseau.store.directory_sink import DirectorySink
from clouseau.store.layout import DEFAULT_PATTERN
from clouseau.store.memory import MemorySink
from clouseau.store.reader import DamagedCaptureWarning, load


def open_sink(
    path: str | os.PathLike[str] | None,
    max_size_mb: float = 1024,
    filename_pattern: str = DEFAULT_PATTERN,
) -> DirectorySink | MemorySink:
    """The sink an instrumented model writes to.

    Parameters
    ----------
    path
        The capture directory (see :class:`DirectorySink`), or None to keep everything
        in memory (:class:`MemorySink`).
    max_size_mb, filename_pattern
        As for :class:`DirectorySink`; checked even when ``path`` is None, so that a bad
        argument fails the same way whatever the path.

    Returns
    -------
    DirectorySink or MemorySink
    """
    if path is None:
        # Validate anyway: a typo must not pass silently until the day path is set.
        from clouseau.store.directory import check_pattern, max_bytes

        max_bytes(max_size_mb)
        check_pattern(filename_pattern)
        return MemorySink()
    return DirectorySink(path, max_size_mb=max_size_mb, filename_pattern=filename_pattern)


__all__ = [
    "AmbiguousPointError",
    "Capture",
    "DamagedCaptureWarning",
    "DirectorySink",
    "MemorySink",
    "Record",
    "load",
    "open_sink",
]
