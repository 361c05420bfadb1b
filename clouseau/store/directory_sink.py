"""``DirectorySink``: the public face of the directory writer (``writer.Core``)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence

from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue
from clouseau.store.capture import Capture
from clouseau.store.directory import capture_path, check_pattern, max_bytes
from clouseau.store.layout import DEFAULT_PATTERN
from clouseau.store.writer import FLUSH_S, Core


class DirectorySink:
    """Writes rolling safetensors files into a capture directory.

    Parameters
    ----------
    path
        The capture directory; created if missing, locked while written (a second writer
        is refused, naming the first). An earlier capture in it is removed once the new
        one has traced (only files clouseau wrote, recognised by their content); a file
        of someone else under a name the capture would write is refused.
    max_size_mb
        Files roll over before the next array would make them larger than this; an array
        larger than the limit gets a file of its own. ``math.inf`` never rolls.
    filename_pattern
        The file names, with an ``{idx}`` field numbering the rolled files.
    flush_s
        A file is written once its first array is this many seconds old, so that a crash
        (``kill -9``) loses at most the calls of the last ``flush_s`` seconds.

    Raises
    ------
    TypeError, ValueError
        A bad ``max_size_mb`` or ``filename_pattern`` (the message says what is expected).
    CaptureError
        ``path`` is a file, cannot be written, holds someone else's file in the way, or
        is being written by another instrumented model.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_size_mb: float = 1024,
        filename_pattern: str = DEFAULT_PATTERN,
        flush_s: float = FLUSH_S,
    ) -> None:
        self.max_bytes = max_bytes(max_size_mb)
        names = check_pattern(filename_pattern) or frozenset()
        if not (isinstance(flush_s, int | float) and flush_s > 0):
            raise ValueError(f"flush_s must be a positive number of seconds; got {flush_s!r}")
        self.path = capture_path(path)
        self.filename_pattern = filename_pattern
        self._core = Core(self.path, self.max_bytes, filename_pattern, float(flush_s), names)
        # Dropped without close(): the files are completed and the thread stops. The
        # finalizer holds the core, never this object, so that it can be collected.
        self._finalizer = weakref.finalize(self, self._core.close_quietly)

    def add_graph(self, graph: Graph) -> int:
        return self._core.add_graph(graph)

    def begin_call(self) -> int:
        return self._core.begin_call()

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        self._core.put(call, graph_id, values)

    def end_call(self, call: int) -> None:
        self._core.end_call(call)

    def fail_call(self, call: int, error: BaseException) -> None:
        self._core.fail_call(call, error)

    def flush(self) -> None:
        self._core.flush()

    def close(self) -> None:
        self._core.close()

    def abandon(self) -> None:
        """Give the sink up: nothing is written if nothing was (see ``Core.abandon``)."""
        self._finalizer.detach()
        self._core.abandon()

    def capture(self) -> Capture:
        self._core.flush()
        from clouseau.store.reader import load

        return load(self.path)
