"""The contract between a lowered (instrumented) model and the capture store.

Frontends hand host copies of saved values to a :class:`Sink`; the store implements it
(to disk, or in memory). The protocol lives in the IR so that neither side imports the
other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

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


@dataclass(frozen=True)
class Saves:
    """Who the values of a :class:`SavedBatch` are, in order: each one's names and node.

    A frontend computes it once per graph (or per sequence of module outputs), not per
    call: it is the part of a put that repeats from call to call.
    """

    names: tuple[tuple[str, ...], ...]
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.names) != len(self.nodes):
            raise ValueError(f"{len(self.names)} names for {len(self.nodes)} nodes")

    def __len__(self) -> int:
        return len(self.nodes)


class SavedBatch(Sequence[SavedValue]):
    """The values of one put (outside loops) as two parts: who they are (``saves``, made
    once) and this call's ``arrays`` (a tuple, in the order of ``saves``).

    It is a sequence of :class:`SavedValue` (made on access), so that any sink takes it;
    a sink on the per-call path reads ``saves`` and ``arrays`` instead, and pays nothing
    per value for the names.
    """

    __slots__ = ("arrays", "saves")

    def __init__(self, saves: Saves, arrays: tuple[Any, ...]) -> None:
        if len(arrays) != len(saves.nodes):
            raise ValueError(f"{len(arrays)} arrays for {len(saves.nodes)} saved values")
        self.saves = saves
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays)

    @overload
    def __getitem__(self, index: int) -> SavedValue: ...
    @overload
    def __getitem__(self, index: slice) -> list[SavedValue]: ...
    def __getitem__(self, index: int | slice) -> SavedValue | list[SavedValue]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return SavedValue(self.saves.names[index], self.saves.nodes[index], self.arrays[index])

    def __repr__(self) -> str:
        return f"SavedBatch({[n[0] for n in self.saves.names]})"


class Sink(Protocol):
    """Where an instrumented model sends what it saves. Every method is thread-safe.

    A sink may also define ``put_call(graph_id, saves, arrays) -> int``: a whole call at
    once (begin, put and end, the values as a :class:`SavedBatch`'s two parts), nothing put
    into it later; see :func:`whole_call`.
    """

    def add_graph(self, graph: Graph) -> int:
        """Record a traced graph (one per input signature); returns its id."""
        ...

    def begin_call(self) -> int:
        """Start one call of the model; returns its call index (0, 1, 2, ...)."""
        ...

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        """Hand over saved values of ``call`` (possibly in several pieces).

        ``values`` may be a :class:`SavedBatch` (the frontends' per-call path): read its
        ``saves`` and ``arrays`` rather than its items where the cost per call matters.
        """
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


#: One whole call put at once: ``(graph_id, saves, arrays) -> call``.
PutCall = Callable[[int, Saves, tuple[Any, ...]], int]


def whole_call(sink: Sink) -> PutCall:
    """How to hand ``sink`` one call's values at once, the call begun and ended with them.

    A frontend that has every value of a call only when it ends (the hook path) pays one
    sink call rather than three: the sink's own ``put_call`` where its class itself
    defines one (a wrapper that forwards attributes, such as generate's call counter,
    or a subclass has none, so its own ``begin_call`` or ``put`` is not bypassed), else
    ``begin_call``, ``put`` (of a :class:`SavedBatch`) and ``end_call``. The values come
    as a batch's two parts, the ``saves`` made once and this call's ``arrays``, so no
    object is made for them. Either way a put that raises leaves the call numbered and
    failed, with the error, and a closed capture raises before numbering any.
    """
    # The class's own, not an inherited one: a subclass may change begin_call or put.
    own = vars(type(sink)).get("put_call")
    if own is not None:
        return own.__get__(sink, type(sink))  # the bound method: no frame of ours per call

    def put_call(graph_id: int, saves: Saves, arrays: tuple[Any, ...]) -> int:
        values = SavedBatch(saves, arrays)  # checked before the call is numbered
        call = sink.begin_call()
        try:
            sink.put(call, graph_id, values)
        except BaseException as error:
            sink.fail_call(call, error)
            raise
        sink.end_call(call)
        return call

    return put_call
