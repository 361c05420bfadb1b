"""Fixtures of the JAX frontend tests: an in-memory sink that records every call."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("jax")
pytest.importorskip("equinox")

from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue


@dataclass
class RecordingSink:
    """A Sink that keeps everything in lists, for assertions."""

    graphs: list[Graph] = field(default_factory=list)
    calls: list[list[tuple[int, SavedValue]]] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_graph(self, graph: Graph) -> int:
        with self._lock:
            self.graphs.append(graph)
            return len(self.graphs) - 1

    def begin_call(self) -> int:
        with self._lock:
            assert not self.closed
            self.calls.append([])
            return len(self.calls) - 1

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        with self._lock:
            self.calls[call].extend((graph_id, v) for v in values)

    def end_call(self, call: int) -> None:
        self.ended.append(call)

    def fail_call(self, call: int, error: BaseException) -> None:
        self.failed.append(call)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def capture(self) -> Any:
        return self.calls

    def values(self, call: int = -1) -> dict[str, Any]:
        """name -> array of one call (scan iterations as name -> {index: array})."""
        out: dict[str, Any] = {}
        for _, value in self.calls[call]:
            for name in value.names:
                if value.index:
                    out.setdefault(name, {})[value.index] = value.array
                else:
                    out[name] = value.array
        return out


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()
