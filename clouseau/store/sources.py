"""Where a loaded array lies on disk, and the proof that the file is still the one loaded.

``clouseau.load`` reads only headers; the arrays are read later, on access, by name of
the file. Between the two the file may have been replaced (a re-run renames its own file
into place), rewritten or truncated. Every loader therefore carries the :class:`Stamp` of
the file it was loaded from (device, inode, size, modification and change times) and
checks it before and after reading: a file that changed is a :class:`CaptureError` naming
it, never another run's values. Reads go through ``pread`` (a truncated file reads short
and is refused); the row readers read with ``pread`` too (:mod:`clouseau.store.row_files`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.store.safetensors_io import TensorEntry, read_array


@dataclass(frozen=True)
class Stamp:
    """What identifies one version of a file: changed when it is replaced or rewritten."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @staticmethod
    def of(result: os.stat_result) -> Stamp:
        return Stamp(
            result.st_dev, result.st_ino, result.st_size, result.st_mtime_ns, result.st_ctime_ns
        )

    @staticmethod
    def current(file: Path) -> Stamp | None:
        """The stamp of ``file`` now (the link itself if it is one); None if it is gone."""
        try:
            return Stamp.of(os.stat(file, follow_symlinks=False))
        except OSError:
            return None


def check_unchanged(file: Path, stamp: Stamp) -> None:
    """Raise CaptureError if ``file`` is no longer the version ``stamp`` describes."""
    now = Stamp.current(file)
    if now == stamp:
        return
    if now is None:
        what = "was removed"
    elif (now.device, now.inode) != (stamp.device, stamp.inode):
        what = "was replaced by another file"
    elif now.size < stamp.size:
        what = f"was cut short (it shrank from {stamp.size} to {now.size} bytes)"
    else:
        what = "was rewritten"
    raise CaptureError(
        f"{file} {what} after clouseau.load read it (another run, or another program, wrote "
        "the capture since); its arrays are not read from a different file: load the "
        "capture again"
    )


@dataclass(frozen=True)
class TensorSource:
    """The loader of one saved array: its file, where it lies, and the file's stamp.

    ``shift`` is added to the values read (a merged capture renumbers the ``sample`` field
    of each part this way, and the row readers still map the file).
    """

    file: Path
    tensor: TensorEntry
    stamp: Stamp
    shift: int = 0

    def __call__(self) -> np.ndarray:
        check_unchanged(self.file, self.stamp)
        array = read_array(self.file, self.tensor)
        # Checked again: a file replaced while it was read must not hand out its bytes.
        check_unchanged(self.file, self.stamp)
        if self.shift:
            array += self.shift
        return array
