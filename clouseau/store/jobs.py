"""The files of one directory sink's job, and small helpers of the writer."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.store.capture import Record
from clouseau.store.files import temp_file
from clouseau.store.layout import FORMAT, PROBE_NAME


@dataclass(frozen=True)
class Job:
    """One file to write: its final path, its arrays with their records, and its calls."""

    path: Path
    items: tuple[Item, ...]
    open: tuple[int, ...]  # calls with values in this file that had not ended when cut
    done: tuple[int, ...]  # calls open in an earlier file that have ended since
    calls: frozenset[int]


# A buffered array: its record, the array, and the record already encoded as JSON.
Item = tuple[Record, np.ndarray, str]


def metadata(records: str, open_calls: Sequence[int], done: Sequence[int]) -> dict[str, str]:
    """A file's ``__metadata__``: the format, its records, and its open and done calls."""
    return {
        "format": FORMAT,
        "clouseau": records,
        "open": "[" + ",".join(map(str, open_calls)) + "]",
        "done": "[" + ",".join(map(str, done)) + "]",
    }


def probe(path: Path) -> None:
    """CaptureError unless a file can be created in ``path``."""
    try:
        fd, file = temp_file(path, PROBE_NAME)
        os.close(fd)
        file.unlink()
    except OSError as err:
        raise CaptureError(
            f"cannot write to the capture path {path}: {err.strerror or err}; "
            "pass a writable directory"
        ) from None


def span(calls: set[int]) -> str:
    """``1, 2, 3`` or ``4..900``: calls for a message."""
    ordered = sorted(calls)
    if not ordered:
        return "(none)"
    return ", ".join(map(str, ordered)) if len(ordered) <= 5 else f"{ordered[0]}..{ordered[-1]}"
