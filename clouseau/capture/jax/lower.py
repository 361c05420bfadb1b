"""Lower an instrumented graph back to runnable JAX: rerun the jaxpr and take out the saves.

:mod:`~clouseau.capture.jax.rerun` re-evaluates the traced jaxpr and opens the sub-jaxprs
that hold saves. :func:`lower` gives two jitted functions of the model's array leaves:

- ``collect`` returns ``(outputs, saved)``: used when the instrumented model is called
  with concrete arrays; the saved values come back as outputs, no host callback (except
  one per ``while_loop`` iteration holding a save, whose count only the run knows).
- ``emitting`` returns the outputs and hands every saved value of the call to the sink in
  one ``jax.debug.callback`` at the end of the call: used inside the user's ``jit``,
  ``vmap``, ``grad``, ``scan``, ``checkpoint``. The callback sits inside a
  ``jax.custom_batching.custom_vmap`` whose rule re-emits the batched arrays, so under
  ``vmap`` one call carries arrays with the batch axes in front (not one call per example);
  the saved values pass ``stop_gradient`` first, so under differentiation JAX runs the
  callback once, on the primal values.

Each saved value is a :class:`Slot` of a :class:`Plan`. Slots without names are hidden:
the branch index of a ``cond`` (the host keeps a value computed in a branch only when that
branch ran) and the trip count of a ``while`` (the call's last delivery waits on it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

from clouseau.capture.jax import host
from clouseau.capture.jax.jaxpr_trace import Traced
from clouseau.capture.jax.rerun import Stream, run
from clouseau.ir.errors import TraceError
from clouseau.ir.graph import Graph
from clouseau.ir.passes import producer_of
from clouseau.ir.sink import Sink

CONTROL = frozenset({"scan", "cond", "while"})


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
    """

    key: str
    output: int
    fn: Callable[[Any], Any]


@dataclass(frozen=True)
class Plan:
    slots: tuple[Slot, ...]
    rewrites: tuple[Rewrite, ...] = ()

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
        prefix = key + "/"
        return any(s.key.startswith(prefix) for s in (*self.slots, *self.rewrites))

    def rewrites_inside(self, key: str) -> bool:
        return any(r.key.startswith(key + "/") for r in self.rewrites)

    def streams_inside(self, key: str) -> bool:
        """A while loop inside ``key`` streams values (it needs the iteration numbers)."""
        return any(s.stream.startswith(key + "/") for s in self.slots)

    def collected_inside(self, key: str) -> list[int]:
        """Slot ids inside ``key`` whose values leave through it (not streamed inside)."""
        stream = self.stream_at(key)
        own = (f"{key}/index", f"{key}/count")  # recorded outside it
        return [
            i
            for i, s in enumerate(self.slots)
            if s.key.startswith(key + "/") and s.key not in own and s.stream == stream
        ]

    def stream_at(self, key: str) -> str:
        """The key of the innermost while around ``key`` whose body streams (``""``)."""
        found = ""
        for s in self.slots:
            if s.stream and key.startswith(s.stream + "/") and len(s.stream) > len(found):
                found = s.stream
        return found

    def streamed_by(self, key: str) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.stream == key]

    @cached_property
    def top(self) -> tuple[int, ...]:
        """Slot ids delivered at the end of the call."""
        return tuple(i for i, s in enumerate(self.slots) if not s.stream)

    @cached_property
    def streams(self) -> bool:
        """A while loop streams values: ``collect`` takes the call index first."""
        return any(s.stream for s in self.slots)

    def rewrite(self, key: str, values: Sequence[Any]) -> list[Any]:
        """``values`` of the equation at ``key`` with its rewrites applied, in order."""
        values = list(values)
        for r in self.rewrites:
            if r.key == key:
                values[r.output] = r.fn(values[r.output])
        return values

    def with_rewrites(self, more: Sequence[Rewrite]) -> Plan:
        return replace(self, rewrites=(*self.rewrites, *more))


@dataclass(frozen=True)
class Lowered:
    """The runnable forms of one instrumented graph (one input signature).

    ``collect(*arrays)`` (``collect(call, *arrays)`` where ``plan.streams``: the call
    index numbers the values a while loop streams) returns ``(outputs, packed)``;
    ``unpack(device_get(packed))`` gives one saved value per id of ``plan.top``.
    """

    graph: Graph
    graph_id: int
    plan: Plan
    collect: Callable[..., Any]
    emitting: Callable[..., Any]
    unpack: Callable[[Sequence[Any]], list[Any]]  # the saved values of collect's packed ones


def make_plan(graph: Graph, rewrites: Sequence[Rewrite] = ()) -> Plan:
    """The slots of the save nodes of ``graph`` in graph order, each hidden one first needed.

    A save of an intervened value sits at the producer's key: the rewrite runs first.
    """
    return _Placer(graph).plan(tuple(rewrites))


class _Placer:
    """Places saved values in the control flow of a graph (see :class:`Slot`)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.control = {n.key: n for n in graph.nodes if n.op in CONTROL}
        self.slots: list[Slot] = []
        self.hidden: dict[str, int] = {}

    def plan(self, rewrites: tuple[Rewrite, ...]) -> Plan:
        for save in self.graph.saves:
            ref = producer_of(self.graph, save.inputs[0])
            node = self.graph.node(ref.node)
            names = save.names
            self.slots.append(self.slot(names, node.name, node.key, ref.index))
        return Plan(tuple(self.slots), rewrites)

    def slot(
        self, names: tuple[str, ...], node: str, key: str, output: int, where: str = ""
    ) -> Slot:
        """The slot of the value at ``key``, computed where the equation ``where`` is."""
        where = where or key
        chain = [k for k in _prefixes(where) if k in self.control]
        whiles = [k for k in chain if self.control[k].op == "while"]
        stream = whiles[-1] if whiles else ""
        inner = chain[chain.index(stream) + 1 :] if stream else chain
        guards = tuple(
            (self.hidden_slot(f"{k}/index", k), _branch(where, k))
            for k in inner
            if self.control[k].op == "cond"
        )
        for k in whiles:
            self.hidden_slot(f"{k}/count", k)
        loops = sum(self.control[k].op == "scan" for k in inner)
        return Slot(names, node, key, output, loops, stream, guards)

    def hidden_slot(self, key: str, owner: str) -> int:
        if key not in self.hidden:
            # Computed just outside the cond or while it belongs to.
            slot = self.slot((), self.control[owner].name, key, 0, where=owner)
            self.hidden[key] = len(self.slots)
            self.slots.append(slot)
        return self.hidden[key]


def _prefixes(key: str) -> list[str]:
    parts = key.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _branch(key: str, cond: str) -> int:
    return int(key[len(cond) + 1 :].split("/")[0].removeprefix("b"))


def loops(graph: Graph, key: str) -> int:
    """How many scans and while loops enclose the equation at ``key``."""
    control = {n.key for n in graph.nodes if n.op in ("scan", "while")}
    return sum(k in control for k in _prefixes(key))


def lower(
    traced: Traced, graph: Graph, graph_id: int, sink: Sink, rewrites: Sequence[Rewrite] = ()
) -> Lowered:
    """Build the ``collect`` and ``emitting`` functions of an instrumented graph.

    ``rewrites`` are the graph's interventions (see :mod:`clouseau.capture.jax.intervene`).
    """
    plan = make_plan(graph, rewrites)
    closed = traced.jaxpr
    stream = Stream(emit=stream_emitter(plan, sink, graph_id))

    layouts: list[host.Layout] = []  # set when collect is traced

    def collect(*arrays: Any) -> tuple[list[Any], list[Any]]:
        call, arrays = (arrays[0], arrays[1:]) if plan.streams else (None, arrays)
        outs, saved = run_call(closed, plan, arrays, replace(stream, call=call))
        layout, packed = pack(saved)
        layouts[:] = [layout]
        return outs, packed

    def unpack(packed: Sequence[Any]) -> list[Any]:
        return host.cut(layouts[0], packed)

    def emitting(*arrays: Any) -> list[Any]:
        call = begin_call(sink) if plan.streams else jnp.int32(-1)
        outs, saved = run_call(closed, plan, arrays, replace(stream, call=call))
        values = [jax.lax.stop_gradient(v) for v in saved]
        emitter(partial(host.deliver, sink, graph_id, plan, plan.top))(call, *values)
        return outs

    return Lowered(graph, graph_id, plan, jax.jit(collect), jax.jit(emitting), unpack)


def run_call(
    closed: Any, plan: Plan, arrays: Sequence[Any], stream: Stream
) -> tuple[list[Any], list[Any]]:
    """The outputs of the model and the values of ``plan.top``."""
    saved: dict[int, Any] = {}
    outs = run(closed.jaxpr, closed.consts, arrays, "", plan, saved, stream)
    missing = [plan.slots[i].names or (plan.slots[i].key,) for i in plan.top if i not in saved]
    if missing:
        raise TraceError(
            f"clouseau could not reach the selected points {[m[0] for m in missing]} when "
            "rerunning the model"
        )
    return outs, [saved[i] for i in plan.top]


def stream_emitter(plan: Plan, sink: Sink, graph_id: int) -> Callable[..., None]:
    def emit(key: str, call: Any, counters: tuple[Any, ...], values: list[Any]) -> None:
        ids = tuple(plan.streamed_by(key))
        put = partial(host.put_stream, sink, graph_id, plan, ids, len(counters))
        emitter(put)(call, *counters, *[jax.lax.stop_gradient(v) for v in values])

    return emit


def begin_call(sink: Sink) -> Any:
    """The sink's next call index, numbered on the host when the computation runs."""
    return io_callback(
        partial(host.begin, sink), jax.ShapeDtypeStruct((), jnp.int32), ordered=False
    )


def emitter(fn: Callable[..., None], nbatch: int = 0) -> Callable[..., Any]:
    """Hand ``(call, *arrays)`` to ``fn(nbatch, call, *arrays)`` once per execution.

    Under ``vmap`` the rule re-emits the batched arrays (unbatched ones broadcast), so one
    host call gets the batch axes in front, ``nbatch`` of them; the call index is never
    batched (a batched copy of it holds the same number).
    """

    @jax.custom_batching.custom_vmap
    def emit(call: Any, *values: Any) -> tuple[()]:
        layout, packed = pack(values)
        jax.debug.callback(partial(host.unpack, fn, nbatch, layout), call, *packed)
        return ()

    @emit.def_vmap
    def _batched(
        axis_size: int, in_batched: list[bool], call: Any, *values: Any
    ) -> tuple[tuple[()], tuple[()]]:
        index = call[0] if in_batched[0] else call
        full = [
            v if b else jnp.broadcast_to(v, (axis_size, *jnp.shape(v)))
            for v, b in zip(values, in_batched[1:], strict=True)
        ]
        emitter(fn, nbatch + 1)(index, *full)
        return (), ()

    return emit


PACKED_BYTES = 1 << 18  # values up to 256 KiB travel packed; larger ones on their own


def pack(values: Sequence[Any]) -> tuple[host.Layout, list[Any]]:
    """Small values raveled into one array per dtype, and where each value is.

    Moving an array to the host (``device_get``, a callback argument) has a fixed cost
    per array that dominates for many small values: packed, they pay it once. A large
    value travels alone, so that packing never copies much.
    """
    by_dtype: dict[str, int] = {}
    args: list[list[Any]] = []
    layout = []
    for value in values:
        shape, dtype = jnp.shape(value), jnp.result_type(value)
        small = math.prod(shape) * dtype.itemsize <= PACKED_BYTES
        arg = by_dtype.get(str(dtype), -1) if small else -1
        if arg < 0:
            arg = len(args)
            args.append([])
            if small:
                by_dtype[str(dtype)] = arg
        layout.append((arg, sum(math.prod(jnp.shape(v)) for v in args[arg]), shape))
        args[arg].append(value)
    packed = [jnp.concatenate([jnp.ravel(v) for v in group]) for group in args]
    return tuple(layout), packed
