"""Lower an instrumented graph back to runnable JAX: rerun the jaxpr and take out the saves.

The traced jaxpr is re-evaluated equation by equation (each equation re-bound as
``jax.core.eval_jaxpr`` does, so the computation is the model's). Sub-jaxprs holding a
save are opened: a ``jit`` is inlined, a ``remat`` is rebuilt with ``jax.checkpoint``
around the interpreted body, a ``scan`` is rebuilt with ``jax.lax.scan`` whose body also
returns its saved values (stacked: one leading axis per enclosing scan).

:func:`lower` gives two jitted functions of the model's array leaves:

- ``collect`` returns ``(outputs, saved)``: used when the instrumented model is called
  with concrete arrays; the saved values come back as outputs, no host callback.
- ``emitting`` returns the outputs and hands every saved value of the call to the sink in
  one ``jax.debug.callback`` at the end of the call: used inside the user's ``jit``,
  ``vmap``, ``grad``, ``scan``, ``checkpoint``. The callback sits inside a
  ``jax.custom_batching.custom_vmap`` whose rule re-emits the batched arrays, so under
  ``vmap`` one call carries arrays with the batch axes in front (not one call per example);
  the saved values pass ``stop_gradient`` first, so under differentiation JAX runs the
  callback once, on the primal values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from clouseau.capture.jax import _compat
from clouseau.capture.jax.jaxpr_trace import Traced
from clouseau.ir.errors import TraceError
from clouseau.ir.graph import Graph
from clouseau.ir.passes import producer_of
from clouseau.ir.sink import SavedValue, Sink


@dataclass(frozen=True)
class Slot:
    """One saved value: which names it has and where in the jaxpr it is computed."""

    names: tuple[str, ...]
    node: str
    key: str
    output: int
    loops: int  # enclosing scans: the saved array has this many leading iteration axes


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

    def at(self, key: str) -> tuple[tuple[int, int], ...]:
        """(slot id, output index) of the saves of the equation (or input) at ``key``."""
        return tuple((i, s.output) for i, s in enumerate(self.slots) if s.key == key)

    def inside(self, key: str) -> bool:
        prefix = key + "/"
        return any(s.key.startswith(prefix) for s in (*self.slots, *self.rewrites))

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
    """The runnable forms of one instrumented graph (one input signature)."""

    graph: Graph
    graph_id: int
    plan: Plan
    collect: Callable[..., Any]
    emitting: Callable[..., Any]


def make_plan(graph: Graph, rewrites: Sequence[Rewrite] = ()) -> Plan:
    """The slots of the save nodes of ``graph``, in graph order, and the given rewrites.

    A save of an intervened value sits at the producer's key: the rewrite runs first.
    """
    slots = []
    for save in graph.saves:
        ref = producer_of(graph, save.inputs[0])
        node = graph.node(ref.node)
        names = save.attr("names")
        assert isinstance(names, tuple)
        slots.append(
            Slot(
                tuple(str(n) for n in names), node.name, node.key, ref.index, loops(graph, node.key)
            )
        )
    return Plan(tuple(slots), tuple(rewrites))


def loops(graph: Graph, key: str) -> int:
    """How many scans enclose the equation at ``key``."""
    scans = {n.key for n in graph.nodes if n.op == "scan"}
    parts = key.split("/")
    return sum("/".join(parts[:i]) in scans for i in range(1, len(parts)))


def lower(
    traced: Traced, graph: Graph, graph_id: int, sink: Sink, rewrites: Sequence[Rewrite] = ()
) -> Lowered:
    """Build the ``collect`` and ``emitting`` functions of an instrumented graph.

    ``rewrites`` are the graph's interventions (see :mod:`clouseau.capture.jax.intervene`).
    """
    plan = make_plan(graph, rewrites)
    closed = traced.jaxpr
    host = partial(deliver, sink, graph_id, plan.slots)

    def collect(*arrays: Any) -> tuple[list[Any], list[Any]]:
        saved: dict[int, Any] = {}
        outs = run(closed.jaxpr, closed.consts, arrays, "", plan, saved)
        missing = [s.names[0] for i, s in enumerate(plan.slots) if i not in saved]
        if missing:
            raise TraceError(
                f"clouseau could not reach the selected points {missing} when rerunning the model"
            )
        return outs, [saved[i] for i in range(len(plan.slots))]

    def emitting(*arrays: Any) -> list[Any]:
        outs, saved = collect(*arrays)
        _emitter(host, 0)(*[jax.lax.stop_gradient(v) for v in saved])
        return outs

    return Lowered(graph, graph_id, plan, jax.jit(collect), jax.jit(emitting))


def run(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    key: str,
    plan: Plan,
    saved: dict[int, Any],
) -> list[Any]:
    """Evaluate ``jaxpr``, putting the values of ``plan``'s slots under ``key`` in ``saved``."""
    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return var.val if type(var).__name__ == "Literal" else env[var]

    def record(where: str, values: Sequence[Any]) -> None:
        for slot, output in plan.at(where):
            saved[slot] = values[output]

    for i, (var, value) in enumerate(zip(jaxpr.constvars, consts, strict=True)):
        where = f"{key}/c{i}" if key else f"c{i}"
        env[var] = value = plan.rewrite(where, [value])[0]
        record(where, [value])
    for i, (var, value) in enumerate(zip(jaxpr.invars, args, strict=True)):
        where = f"{key}/in{i}" if key else f"in{i}"
        env[var] = value = plan.rewrite(where, [value])[0]
        record(where, [value])
    for position, eqn in enumerate(jaxpr.eqns):
        ekey = f"{key}/{position}" if key else str(position)
        invals = [read(v) for v in eqn.invars]
        if plan.inside(ekey):
            outs = _open(eqn, ekey, invals, plan, saved)
        else:
            outs = _compat.bind_equation(eqn, invals)
        outs = plan.rewrite(ekey, outs)  # interventions and gradient taps of this equation
        for var, value in zip(eqn.outvars, outs, strict=True):
            env[var] = value
        record(ekey, outs)
    return [read(v) for v in jaxpr.outvars]


def _open(eqn: Any, key: str, invals: list[Any], plan: Plan, saved: dict[int, Any]) -> list[Any]:
    prim = eqn.primitive.name
    params = eqn.params
    if prim in ("jit", "pjit"):
        inner = params["jaxpr"]
        return run(inner.jaxpr, inner.consts, invals, key, plan, saved)
    if prim in ("remat2", "checkpoint", "remat"):
        order: list[int] = []

        def body(*args: Any) -> tuple[list[Any], list[Any]]:
            local: dict[int, Any] = {}
            outs = run(params["jaxpr"], (), args, key, plan, local)
            order[:] = sorted(local)
            return outs, [local[i] for i in order]

        outs, values = jax.checkpoint(
            body, prevent_cse=params["prevent_cse"], policy=params["policy"]
        )(*invals)
        saved.update(zip(order, values, strict=True))
        return list(outs)
    if prim == "scan":
        return _open_scan(params, key, invals, plan, saved)
    raise TraceError(
        f"clouseau cannot save a value computed inside {prim}: its body runs a data-dependent "
        "number of times. Select a point outside it, or write the loop with jax.lax.scan."
    )


def _open_scan(
    params: dict[str, Any], key: str, invals: list[Any], plan: Plan, saved: dict[int, Any]
) -> list[Any]:
    body_jaxpr = params["jaxpr"]
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    consts, init, xs = (
        invals[:n_consts],
        invals[n_consts : n_consts + n_carry],
        invals[n_consts + n_carry :],
    )
    order: list[int] = []

    def body(carry: list[Any], x: list[Any]) -> tuple[list[Any], tuple[list[Any], list[Any]]]:
        local: dict[int, Any] = {}
        outs = run(body_jaxpr.jaxpr, body_jaxpr.consts, [*consts, *carry, *x], key, plan, local)
        order[:] = sorted(local)
        return outs[:n_carry], (outs[n_carry:], [local[i] for i in order])

    carry, (ys, values) = jax.lax.scan(
        body,
        list(init),
        list(xs),
        length=params["length"],
        reverse=params["reverse"],
        unroll=params["unroll"],
    )
    saved.update(zip(order, values, strict=True))
    return [*carry, *ys]


def _emitter(host: Callable[..., None], nbatch: int) -> Callable[..., Any]:
    """A function that hands its arguments to ``host(nbatch, *arrays)`` once per call."""

    @jax.custom_batching.custom_vmap
    def emit(*values: Any) -> tuple[()]:
        jax.debug.callback(partial(host, nbatch), *values)
        return ()

    @emit.def_vmap
    def _batched(
        axis_size: int, in_batched: list[bool], *values: Any
    ) -> tuple[tuple[()], tuple[()]]:
        # One call with the batch axis in front; values that do not vary are broadcast.
        full = [
            v if b else jnp.broadcast_to(v, (axis_size, *jnp.shape(v)))
            for v, b in zip(values, in_batched, strict=True)
        ]
        _emitter(host, nbatch + 1)(*full)
        return (), ()

    return emit


def deliver(
    sink: Sink,
    graph_id: int,
    slots: tuple[Slot, ...],
    nbatch: int,
    *arrays: Any,
    call: int | None = None,
) -> None:
    """Hand one call's saved arrays to the sink; scan iterations become separate values.

    ``call`` is the index the caller took with ``sink.begin_call()`` before running the
    model (so that a failing run is recorded); ``None`` begins the call here (callbacks).
    """
    call = sink.begin_call() if call is None else call
    try:
        values: list[SavedValue] = []
        for slot, array in zip(slots, arrays, strict=True):
            values.extend(_split_loops(slot, np.asarray(array), nbatch))
        sink.put(call, graph_id, values)
    except BaseException as err:
        sink.fail_call(call, err)
        raise
    sink.end_call(call)


def _split_loops(slot: Slot, array: np.ndarray, nbatch: int) -> list[SavedValue]:
    # No copies: the arrays come from device_get or a host callback and view immutable
    # JAX buffers, which nothing can write to while the sink holds them.
    array = np.asarray(array)
    if slot.loops == 0:
        return [SavedValue(slot.names, slot.node, array)]
    lead = (slice(None),) * nbatch
    iterations = array.shape[nbatch : nbatch + slot.loops]
    return [
        SavedValue(
            slot.names,
            slot.node,
            array[(*lead, *index)],
            tuple(int(i) for i in index),
        )
        for index in np.ndindex(*iterations)
    ]
