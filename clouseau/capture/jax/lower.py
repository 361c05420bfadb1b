"""Lower an instrumented graph back to runnable JAX: rerun the jaxpr and take out the saves.

:mod:`~clouseau.capture.jax.interpret` re-evaluates the traced jaxpr and opens the
sub-jaxprs that hold saves. :func:`runnable` gives two jitted functions of the model's
array leaves (a :class:`Runnable`):

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

Each saved value is a :class:`~clouseau.capture.jax.plan.Slot` of the graph's
:class:`~clouseau.capture.jax.plan.Plan`; the values reach the sink through the receivers
of :mod:`~clouseau.capture.jax.receivers`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

from clouseau.capture.jax import receivers
from clouseau.capture.jax.computed import fill
from clouseau.capture.jax.interpret import Stream, run
from clouseau.capture.jax.jaxpr_trace import Traced
from clouseau.capture.jax.plan import Plan, Rewrite, make_plan
from clouseau.capture.jax.processes import multiprocess, to_host
from clouseau.ir.errors import TraceError
from clouseau.ir.graph import Graph
from clouseau.ir.sink import Sink


@dataclass(frozen=True)
class Runnable:
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


def runnable(
    traced: Traced,
    graph: Graph,
    graph_id: int,
    sink: Sink,
    rewrites: Sequence[Rewrite] = (),
    changes: Mapping[str, Callable[[Any], Any]] | None = None,
) -> Runnable:
    """Build the ``collect`` and ``emitting`` functions of an instrumented graph.

    ``rewrites`` are the graph's interventions, ``changes`` those on computed points (see
    :mod:`clouseau.capture.jax.intervene`).
    """
    plan = make_plan(graph, rewrites, changes)
    closed = traced.jaxpr
    stream = Stream(emit=stream_emitter(plan, sink, graph_id))

    layouts: list[receivers.Layout] = []  # set when collect is traced

    def collect(*arrays: Any) -> tuple[list[Any], list[Any]]:
        call, arrays = (arrays[0], arrays[1:]) if plan.streams else (None, arrays)
        outs, saved = run_call(closed, plan, arrays, replace(stream, call=call), graph)
        if multiprocess():  # values stay whole: a sharded one is written shard by shard
            layouts[:] = [None]
            return outs, saved
        layout, packed = pack(saved)
        layouts[:] = [layout]
        return outs, packed

    def unpack(packed: Sequence[Any]) -> list[Any]:
        if layouts[0] is None:
            return to_host(packed)
        return receivers.cut(layouts[0], jax.device_get(packed))

    def emitting(*arrays: Any) -> list[Any]:
        call = begin_call(sink) if plan.streams else jnp.int32(-1)
        outs, saved = run_call(closed, plan, arrays, replace(stream, call=call), graph)
        values = [jax.lax.stop_gradient(v) for v in saved]
        emitter(partial(receivers.deliver, sink, graph_id, plan, plan.top))(call, *values)
        return outs

    return Runnable(graph, graph_id, plan, jax.jit(collect), jax.jit(emitting), unpack)


def run_call(
    closed: Any, plan: Plan, arrays: Sequence[Any], stream: Stream, graph: Graph
) -> tuple[list[Any], list[Any]]:
    """The outputs of the model and the values of ``plan.top`` (of ``graph``'s saves)."""
    saved: dict[int, Any] = {}
    outs = run(closed.jaxpr, closed.consts, arrays, "", plan, saved, stream)
    if plan.computed:
        fill(closed, graph, plan, saved)  # after the model: its values stay bitwise
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
        put = partial(receivers.put_stream, sink, graph_id, plan, ids, len(counters))
        emitter(put)(call, *counters, *[jax.lax.stop_gradient(v) for v in values])

    return emit


def begin_call(sink: Sink) -> Any:
    """The sink's next call index, numbered on the host when the computation runs."""
    return io_callback(
        partial(receivers.begin, sink), jax.ShapeDtypeStruct((), jnp.int32), ordered=False
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
        jax.debug.callback(partial(receivers.unpack, fn, nbatch, layout), call, *packed)
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


def pack(values: Sequence[Any]) -> tuple[receivers.Layout, list[Any]]:
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
