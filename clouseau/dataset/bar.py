"""The progress line of ``clouseau.record``: batches, samples/s and MB/s written.

Shown on a terminal only (stderr is a TTY) and redrawn at most ten times a second, so a
log file or a notebook's captured stderr gets nothing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Bar:
    """A one-line progress display; inactive when ``enabled`` is false or not a TTY."""

    def __init__(self, total: int | None, enabled: bool, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.active = enabled and _is_tty(self.stream)
        self.total = total
        self.started = time.perf_counter()
        self.shown = 0.0
        self.batches = self.samples = self.nbytes = 0

    def update(self, batches: int, samples: int, nbytes: int, *, force: bool = False) -> None:
        self.batches, self.samples, self.nbytes = batches, samples, nbytes
        if not self.active:
            return
        now = time.perf_counter()
        if not force and now - self.shown < 0.1:
            return
        self.shown = now
        elapsed = max(now - self.started, 1e-9)
        total = f"/{self.total}" if self.total is not None else ""
        self.stream.write(
            f"\rclouseau.record: {batches}{total} batches, {samples / elapsed:,.0f} samples/s, "
            f"{nbytes / elapsed / 1e6:,.1f} MB/s "
        )
        self.stream.flush()

    def close(self) -> None:
        if self.active:
            self.update(self.batches, self.samples, self.nbytes, force=True)
            self.stream.write("\n")
            self.stream.flush()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
