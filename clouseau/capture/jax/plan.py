"""The contract between placing the saves and running them: :class:`Plan`, its slots and rewrites.

:func:`make_plan` reads an instrumented IR graph and says, for each saved value, at which
equation key (see :mod:`~clouseau.capture.jax.keys`) and output the value is computed and
which control flow encloses it (a :class:`Slot`); interventions and gradient taps are
:class:`Rewrite` s of a value at its key. The jaxpr interpreter
(:mod:`~clouseau.capture.jax.interpret`) fills the slots and applies the rewrites while it
reruns the model; the host-callback receivers (:mod:`~clouseau.capture.jax.receivers`)
turn the filled slots into the sink's saved values. This module imports neither, so the
three depend on the plan and not on each other.

Slots without names are hidden: the branch index of a ``cond`` (the host keeps a value
computed in a branch only when that branch ran) and the trip count of a ``while`` (the
call's last delivery waits on it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from clouseau.capture.jax.computed import READ_AT, intervened_kernels, reads
from clouseau.capture.jax.keys import (
    CONTROL,
    LOOPS,
    branch_of,
    count_key,
    enclosing,
    index_key,
    is_inside,
)
from clouseau.ir.computed import is_computed
from clouseau.ir.graph import Graph, Node, Ref
from clouseau.ir.passes import producer_of


@dataclass(frozen=True)
class Slot:
    """One saved value: which names it has and where in the jaxpr it is computed.

    ``stream`` is the key of the innermost ``while`` around it (``""``: the value leaves
    with the call's other values); ``loops`` counts the scans between there and the value
    (its leading iteration axes); ``guards`` pair the slot id of an enclosing cond's
    branch index with the branch the value is computed in.
    """

    names: tuple[str, ...]  # () for a hidden slot
    node: str
    key: str
    output: int
    loops: int
    stream: str = ""
    guards: tuple[tuple[int, int], ...] = ()

    @property
    def nested(self) -> bool:
        """Inside a scan, cond or while of the model."""
        return bool(self.loops or self.stream or self.guards)


@dataclass(frozen=True, eq=False)
class Rewrite:
    """Replace output ``output`` of the equation (or input) at ``key`` by ``fn(value)``.

    An intervention, or a gradient tap: later equations and saves read the new value.
    With ``inputs``, ``fn(outputs, inputs)`` gives all the equation's outputs from its
    inputs (a fused kernel replaced by its decomposition), followed by values that only
    slots read (the pattern the model reads, at the offsets of
    :data:`~clouseau.capture.jax.computed.READ_AT`).
    """

    key: str
    output: int
    fn: Callable[..., Any]
    inputs: bool = False
    # Model values fn reads besides (fn(value, *theirs): a projection recomputed from an
    # intervened head_out and the z it is computed from), and their internal slots, set
    # by make_plan; computed before ``key`` in the same jaxpr.
    reads: tuple[Ref, ...] = ()
    slots: tuple[int, ...] = ()


@dataclass(frozen=True)
class Computed:
    """A saved computed point (:mod:`clouseau.ir.computed`): its slot, filled after the run
    from the internal slots ``reads`` (see :mod:`~clouseau.capture.jax.computed`)."""

    slot: int
    node: str
    reads: tuple[int, ...]
    change: Callable[[Any], Any] | None = None  # its intervention: the saved value changed


@dataclass(frozen=True)
class Plan:
    """The saved values (slots) and the rewrites of one instrumented graph."""

    slots: tuple[Slot, ...]
    rewrites: tuple[Rewrite, ...] = ()
    computed: tuple[Computed, ...] = ()

    def record(self, key: str, values: Sequence[Any], saved: dict[int, Any]) -> None:
        """Put the values of the slots at ``key`` (an equation or input) in ``saved``."""
        for i in self._by_key.get(key, ()):
            saved[i] = values[self.slots[i].output]

    @cached_property
    def _by_key(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for i, slot in enumerate(self.slots):
            found.setdefault(slot.key, []).append(i)
        return found

    def inside(self, key: str) -> bool:
        """A slot or a rewrite is inside the equation at ``key`` (it must be opened)."""
        return any(is_inside(s.key, key) for s in (*self.slots, *self.rewrites))

    def rewrites_inside(self, key: str) -> bool:
        return any(is_inside(r.key, key) for r in self.rewrites)

    def streams_inside(self, key: str) -> bool:
        """A while loop inside ``key`` streams values (it needs the iteration numbers)."""
        return any(is_inside(s.stream, key) for s in self.slots)

    def collected_inside(self, key: str) -> list[int]:
        """Slot ids inside ``key`` whose values leave through it (not streamed inside)."""
        stream = self.stream_at(key)
        own = (index_key(key), count_key(key))  # recorded outside it
        return [
            i
            for i, s in enumerate(self.slots)
            if is_inside(s.key, key) and s.key not in own and s.stream == stream
        ]

    def stream_at(self, key: str) -> str:
        """The key of the innermost while around ``key`` whose body streams (``""``)."""
        found = ""
        for s in self.slots:
            if s.stream and is_inside(key, s.stream) and len(s.stream) > len(found):
                found = s.stream
        return found

    def streamed_by(self, key: str) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.stream == key]

    @cached_property
    def top(self) -> tuple[int, ...]:
        """Slot ids delivered at the end of the call (not what computed points read)."""
        internal = {i for c in self.computed for i in c.reads}
        internal.update(i for r in self.rewrites for i in r.slots)
        return tuple(i for i, s in enumerate(self.slots) if not s.stream and i not in internal)

    @cached_property
    def streams(self) -> bool:
        """A while loop streams values: ``collect`` takes the call index first."""
        return any(s.stream for s in self.slots)

    def rewrite(
        self, key: str, values: Sequence[Any], inputs: Sequence[Any], saved: dict[int, Any]
    ) -> list[Any]:
        """``values`` of the equation at ``key`` (its ``inputs``; ``saved``: the slots
        filled so far) with its rewrites applied, in order."""
        values = list(values)
        for r in self.rewrites:
            if r.key == key and r.inputs:
                values = list(r.fn(values, inputs))
            elif r.key == key:
                values[r.output] = r.fn(values[r.output], *[saved[i] for i in r.slots])
        return values

    def with_rewrites(self, more: Sequence[Rewrite]) -> Plan:
        return replace(self, rewrites=(*self.rewrites, *more))


def make_plan(
    graph: Graph,
    rewrites: Sequence[Rewrite] = (),
    changes: Mapping[str, Callable[[Any], Any]] | None = None,
) -> Plan:
    """The slots of the save nodes of ``graph`` in graph order, each hidden one first needed.

    A save of an intervened value sits at the producer's key: the rewrite runs first.
    ``changes`` are the interventions on computed points, by point: a saved one is the
    changed value.
    """
    return _Placer(graph).plan(tuple(rewrites), changes or {})


class _Placer:
    """Places saved values in the control flow of a graph (see :class:`Slot`)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.control = {n.key: n for n in graph.nodes if n.op in CONTROL}
        self.slots: list[Slot] = []
        self.hidden: dict[str, int] = {}

    def plan(self, rewrites: tuple[Rewrite, ...], changes: Mapping[str, Any]) -> Plan:
        computed: list[Computed] = []
        rewrites = tuple(self.reading(r) for r in rewrites)
        decomposed = intervened_kernels(self.graph)
        for save in self.graph.saves:
            ref = producer_of(self.graph, save.inputs[0])
            node = self.graph.node(ref.node)
            names = save.names
            if node.attr("kernel") in decomposed:
                # What the model reads, computed where the decomposition replaces the kernel.
                kernel = self.graph.node(str(node.attr("kernel")))
                at = len(kernel.outputs) + READ_AT[str(node.attr("attention"))]
                self.slots.append(self.slot(names, node.name, kernel.key, at))
                continue
            if is_computed(node):
                computed.append(replace(self.computed(names, node), change=changes.get(node.name)))
                continue
            self.slots.append(self.slot(names, node.name, node.key, ref.index))
        return Plan(tuple(self.slots), rewrites, tuple(computed))

    def reading(self, rewrite: Rewrite) -> Rewrite:
        """``rewrite`` with the internal slots of the values it reads."""
        if not rewrite.reads:
            return rewrite
        return replace(rewrite, slots=tuple(self.internal(ref) for ref in rewrite.reads))

    def internal(self, ref: Ref) -> int:
        """A new internal slot of the model value ``ref`` (after its interventions)."""
        ref = producer_of(self.graph, ref)  # an intervened value is rewritten at its producer
        source = self.graph.node(ref.node)
        self.slots.append(self.slot((), source.name, source.key, ref.index))
        return len(self.slots) - 1

    def computed(self, names: tuple[str, ...], node: Node) -> Computed:
        """A computed point's slot, where the deepest value it reads is, and its read slots."""
        ids = []
        for ref in reads(self.graph, node):
            ids.append(self.internal(ref))
        deepest = max((self.slots[i] for i in ids), key=lambda s: s.loops)
        self.slots.append(replace(deepest, names=names, node=node.name, key="", output=0))
        return Computed(len(self.slots) - 1, node.name, tuple(ids))

    def slot(
        self, names: tuple[str, ...], node: str, key: str, output: int, where: str = ""
    ) -> Slot:
        """The slot of the value at ``key``, computed where the equation ``where`` is."""
        where = where or key
        chain = [k for k in enclosing(where) if k in self.control]
        whiles = [k for k in chain if self.control[k].op == "while"]
        stream = whiles[-1] if whiles else ""
        inner = chain[chain.index(stream) + 1 :] if stream else chain
        guards = tuple(
            (self.hidden_slot(index_key(k), k), branch_of(where, k))
            for k in inner
            if self.control[k].op == "cond"
        )
        for k in whiles:
            self.hidden_slot(count_key(k), k)
        loops = sum(self.control[k].op == "scan" for k in inner)
        return Slot(names, node, key, output, loops, stream, guards)

    def hidden_slot(self, key: str, owner: str) -> int:
        if key not in self.hidden:
            # Computed just outside the cond or while it belongs to.
            slot = self.slot((), self.control[owner].name, key, 0, where=owner)
            self.hidden[key] = len(self.slots)
            self.slots.append(slot)
        return self.hidden[key]


def loops(graph: Graph, key: str) -> int:
    """How many scans and while loops enclose the equation at ``key``."""
    control = {n.key for n in graph.nodes if n.op in LOOPS}
    return sum(k in control for k in enclosing(key))
