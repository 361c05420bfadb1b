"""A column's files, read with ``pread``: a file cut short is an error, never a signal.

A file truncated under a memory map ends the process with SIGBUS on the next load from a
lost page, and no check made before the load can exclude a truncation between the check
and the copy. So the row readers map nothing: rows are read with ``pread`` straight into
the new array handed out, one call per run of neighbouring rows (a whole range of rows is
one call per file; a shuffled batch, a call per row). A file that shrank reads short, and
a short read is a :class:`CaptureError`. A read costs the rows asked for, never the file:
nothing of the file is mapped into the process.

Each file is opened once (without following a link, a regular file only) and kept open,
up to :data:`MAX_OPEN`; its stamp is checked against ``load``'s before and after every
read, so a file replaced, rewritten or cut short since is refused.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.store.files import open_regular, read_at
from clouseau.store.sources import Stamp, check_unchanged

# Files held open at once by one column: a recording may have tens of thousands of files.
MAX_OPEN = 256


class RowFiles:
    """Open descriptors of a column's files (least recently used closed first)."""

    def __init__(self, stamps: dict[Path, Stamp | None]) -> None:
        self.stamps = stamps
        self._open: OrderedDict[Path, int] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        # Files are opened again in the receiving process (a DataLoader worker).
        return {"stamps": self.stamps, "_open": OrderedDict()}

    def __del__(self, _close: Any = os.close) -> None:
        # os.close bound early: at interpreter exit the module's globals may be gone.
        while self._open:
            try:  # noqa: SIM105 (no contextlib at exit either)
                _close(self._open.popitem()[1])
            except OSError:  # closed already
                pass

    def read(self, file: Path, view: memoryview, offset: int) -> None:
        """Fill ``view`` with the bytes of ``file`` at ``offset``, or raise CaptureError."""
        fd = self._file(file)
        try:
            got = read_at(fd, view, offset)
        except OSError as err:
            raise CaptureError(f"cannot read rows from {file}: {err.strerror or err}") from err
        if got != len(view):
            self._refuse(file, f"reads short at byte {offset + got} of {offset + len(view)}")

    def gather(self, file: Path, out: np.ndarray, slots: np.ndarray, offsets: np.ndarray) -> None:
        """Rows of ``out`` (a new 2-d byte array) at ``slots`` from bytes ``offsets`` of ``file``.

        ``offsets`` ascend; a run of neighbouring rows is read in one call.
        """
        row, fd = out.shape[1], self._file(file)
        raw = memoryview(out.reshape(-1))
        cut = (np.diff(slots) != 1) | (np.diff(offsets) != row)
        heads = np.concatenate([[0], np.flatnonzero(cut) + 1])
        sizes = np.diff(np.append(heads, slots.size)) * row
        starts, at = (slots[heads] * row).tolist(), offsets[heads].tolist()
        # The loop is the cost of a shuffled batch: nothing else in it.
        read = getattr(os, "preadv", None) or (lambda *_: -1)  # -1: through self.read
        try:
            for start, size, offset in zip(starts, sizes.tolist(), at, strict=True):
                if read(fd, (raw[start : start + size],), offset) != size:
                    self.read(file, raw[start : start + size], offset)  # short: again, or refused
        except OSError as err:
            raise CaptureError(f"cannot read rows from {file}: {err.strerror or err}") from err

    def check(self, file: Path) -> None:
        """After reads: ``file`` is still the version ``load`` read (else CaptureError)."""
        stamp, fd = self.stamps.get(file), self._open.get(file)
        if stamp is not None and fd is not None and Stamp.of(os.fstat(fd)) != stamp:
            self._refuse(file, "changed while its rows were read")

    def _file(self, file: Path) -> int:
        """The descriptor of ``file``, checked against ``load``'s stamp."""
        stamp = self.stamps.get(file)
        if stamp is not None:
            check_unchanged(file, stamp)  # by name: a file replaced since load
        found = self._open.get(file)
        if found is not None:
            self._open.move_to_end(file)
            return found
        fd = open_regular(file)  # never through a link, never a FIFO or a device
        if stamp is not None and Stamp.of(os.fstat(fd)) != stamp:
            os.close(fd)
            self._refuse(file, "changed as it was opened")
        self._open[file] = fd
        while len(self._open) > MAX_OPEN:
            os.close(self._open.popitem(last=False)[1])
        return fd

    def _refuse(self, file: Path, what: str) -> None:
        stamp = self.stamps.get(file)
        if stamp is not None:
            check_unchanged(file, stamp)  # names the change when the name shows it
        raise CaptureError(
            f"{file} {what} after clouseau.load read it (another run, or another program, "
            "wrote the capture since); its rows are not read from a changed file: load the "
            "capture again"
        )
