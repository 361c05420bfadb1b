"""The progress record of a recording: ``record.json`` in the capture directory.

It lists the files that are complete and the batches they hold (index, sample range, a
digest of the batch's inputs), the batches that failed, the running statistics as they
were after the last listed batch, and what the run was (model, selection, layout, data
length), so that ``record(..., resume=True)`` continues exactly where the files end and
refuses a run that would not continue the same recording. It is replaced atomically
(written aside, then renamed), after the file it lists is renamed into place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clouseau.ir.errors import CaptureError
from clouseau.store.files import read_json, write_json
from clouseau.store.layout import RECORD_FILE, RECORD_FORMAT


@dataclass(frozen=True)
class Batch:
    """One batch of the data: its index, samples ``[start, stop)`` and input digest.

    ``error`` is set for a batch that failed (skipped with ``on_error="skip"``): it
    stored nothing.
    """

    index: int
    start: int
    stop: int
    digest: str
    error: str | None = None

    def to_json(self) -> list[Any]:
        return [self.index, self.start, self.stop, self.digest, self.error]

    @staticmethod
    def from_json(item: list[Any]) -> Batch:
        index, start, stop, digest, error = item
        return Batch(int(index), int(start), int(stop), str(digest), error)


@dataclass(frozen=True)
class Progress:
    """What ``record.json`` holds; see the module docstring."""

    run: dict[str, Any]
    files: tuple[str, ...] = ()
    batches: tuple[Batch, ...] = ()
    stats: dict[str, Any] = field(default_factory=dict)
    done: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "run": self.run,
            "files": list(self.files),
            "batches": [b.to_json() for b in self.batches],
            "stats": self.stats,
            "done": self.done,
        }

    @staticmethod
    def from_json(data: Any) -> Progress:
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            raise ValueError(f"not a {RECORD_FORMAT} record")
        return Progress(
            run=dict(data["run"]),
            files=tuple(map(str, data["files"])),
            batches=tuple(Batch.from_json(b) for b in data["batches"]),
            stats=dict(data["stats"]),
            done=bool(data["done"]),
        )


def read_progress(path: Path) -> Progress | None:
    """The progress record in capture directory ``path``; None if it has none."""
    file = path / RECORD_FILE
    if not os.path.lexists(file):
        return None
    try:
        return Progress.from_json(read_json(file))  # a regular file, size-capped
    except OSError as err:
        raise CaptureError(f"cannot read {file}: {err.strerror or err}") from None
    except (ValueError, KeyError, TypeError) as err:
        raise CaptureError(
            f"{file} is damaged ({type(err).__name__}: {err}); record again without resume"
        ) from None


def write_json_atomic(file: Path, data: object) -> None:
    """Write ``data`` as JSON to ``file`` atomically (an exclusive, unpredictable temporary
    file, then a rename over the previous version)."""
    try:
        write_json(file, data, replace=True)
    except OSError as err:
        raise CaptureError(f"cannot write {file}: {err.strerror or err}") from err


def write_progress(path: Path, progress: Progress) -> None:
    write_json_atomic(path / RECORD_FILE, progress.to_json())


def check_same_run(old: dict[str, Any], new: dict[str, Any], path: Path) -> None:
    """Refuse to resume a recording with a different model, selection, layout or data."""
    what = {
        "model": "the model (its class, parameter names, shapes, dtypes or values)",
        "select": "the selection",
        "rows": "the rows layout",
        "mask": "the mask",
        "fields": "the fields",
        "stats": "the statistics",
        "data_len": "the length of the data",
        "max_size_mb": "max_size_mb",
        "filename_pattern": "filename_pattern",
        "forward": "forward= (the function that runs a batch)",
    }
    for key, label in what.items():
        if key == "data_len" and None in (old.get(key), new.get(key)):
            continue  # a generator's length is unknown; the replayed batches are checked
        if old.get(key) != new.get(key):
            raise CaptureError(
                f"cannot resume the recording in {path}: {label} changed "
                f"(recorded {_short(old.get(key))}, now {_short(new.get(key))}). Resume with "
                "the same model, selection and data, or record again with resume=False "
                "(which replaces the recording)."
            )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
