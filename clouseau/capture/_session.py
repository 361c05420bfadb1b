"""What every instrumented model shares: a sink, ``close()``, the context manager, ``captured``."""

from __future__ import annotations

from typing import Any

from clouseau.ir.sink import Sink


class CaptureSession:
    """Mixin for instrumented models. Subclasses set ``self._sink`` in ``__init__``."""

    _sink: Sink

    def flush(self) -> None:
        """Write everything captured so far to disk (complete files, renamed into place)."""
        self._sink.flush()

    def close(self) -> None:
        """Flush and close the capture; the model must not be called afterwards."""
        self._sink.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def captured(self) -> Any:
        """A :class:`clouseau.Capture` of everything captured so far."""
        return self._sink.capture()
