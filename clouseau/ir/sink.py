"""The contract between a lowered (instrumented) model and the capture store.

Frontends hand host copies of saved values to a :class:`Sink`; the store implements it
(to disk, or in memory). The protocol lives in the IR so that neither side imports the
other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph

#: ``(start, stop)`` per axis of a global array.
Bounds = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Shards:
    """The shards one process holds of an array sharded over several processes (JAX's
    multi-controller runtime): ``(bounds, data)`` per shard of the global ``shape``.

    A frontend hands it to the sink as a :class:`SavedValue`'s array; the distributed
    store writes it shard by shard and reassembles the global array when read.
    """

    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype
    held: tuple[tuple[Bounds, Any], ...]  # (bounds, numpy array) per shard

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, index: object) -> Any:
        # The host splits a value saved inside scan or while by iteration; the shards of
        # one held by several processes are not split.
        raise CaptureError(
            "a point saved inside scan or while loops holds a value sharded over "
            "several JAX processes, which clouseau cannot split by iteration; select "
            "points outside the loop, or capture in one process"
        )


@dataclass(frozen=True)
class SavedValue:
    """One value written by a save node during one call of the model.

    ``array`` is a numpy array the sink may keep (the frontend made the copy).
    ``index`` locates the value inside loops (the scan iteration), ``()`` elsewhere.
    """

    names: tuple[str, ...]
    node: str
    array: Any
    index: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.names[0]


class Sink(Protocol):
    """Where an instrumented model sends what it saves. Every method is thread-safe."""

    def add_graph(self, graph: Graph) -> int:
        """Record a traced graph (one per input signature); returns its id."""
        ...

    def begin_call(self) -> int:
        """Start one call of the model; returns its call index (0, 1, 2, ...)."""
        ...

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        """Hand over saved values of ``call`` (possibly in several pieces)."""
        ...

    def end_call(self, call: int) -> None:
        """The call returned normally: all its values have been put."""
        ...

    def fail_call(self, call: int, error: BaseException) -> None:
        """The call raised ``error``; what it put so far is kept and marked incomplete."""
        ...

    def flush(self) -> None:
        """Make everything put so far durable (written and renamed into place)."""
        ...

    def close(self) -> None:
        """Flush and release; further calls raise."""
        ...

    def capture(self) -> Any:
        """A Capture of everything put so far (``fmodel.captured``)."""
        ...
