"""Lowering of the intervene and save_grad IR nodes in the jaxpr rewrite.

An intervene node becomes a :class:`~clouseau.capture.jax.plan.Rewrite` of the value at
its producer's key: :func:`~clouseau.capture.jax.interpret.run` replaces the value by
``action.apply(value, JaxOps())`` before any later equation (or save) reads it, so it
works under ``jit``, ``vmap``, ``grad`` and inside ``scan`` bodies like the model.

A save_grad node becomes a tap: a ``custom_vjp`` identity whose backward hands the
cotangent (the gradient of the differentiated output w.r.t. the value) to the sink. The
call it belongs to is numbered on the host at the start of the forward pass by an
``io_callback`` (so the forward saves and the backward gradients share the call index);
the number travels to the backward pass as the tap's residual. Taps exist only in the
form used inside the user's transformations (a model called on concrete arrays is not
being differentiated).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from clouseau.capture.jax import decompose, receivers
from clouseau.capture.jax.computed import kernel_points
from clouseau.capture.jax.interpret import Stream
from clouseau.capture.jax.jaxpr_trace import Traced
from clouseau.capture.jax.lower import begin_call, emitter, run_call, stream_emitter
from clouseau.capture.jax.plan import Plan, Rewrite, loops
from clouseau.ir.actions import Action
from clouseau.ir.computed import is_computed
from clouseau.ir.graph import Graph
from clouseau.ir.passes import producer_of
from clouseau.ir.sink import SavedValue, Sink


class JaxOps:
    """The :class:`~clouseau.ir.actions.ArrayOps` of JAX arrays (tracers included)."""

    def zeros_like(self, value: Any) -> Any:
        return jnp.zeros_like(value)

    def clip(self, value: Any, lo: float | None, hi: float | None) -> Any:
        return jnp.clip(value, lo, hi)

    def batch_mean(self, value: Any) -> Any:
        return jnp.broadcast_to(value.mean(axis=0, keepdims=True), value.shape)

    def normal(self, value: Any, seed: int) -> Any:
        return jax.random.normal(jax.random.key(seed), value.shape, value.dtype)

    def constant(self, array: Any, like: Any) -> Any:
        return jnp.broadcast_to(jnp.asarray(array, dtype=like.dtype), like.shape)


_OPS = JaxOps()


def intervention_rewrites(
    traced: Traced, graph: Graph, actions: Mapping[str, Action]
) -> tuple[tuple[Rewrite, ...], dict[str, Callable[[Any], Any]]]:
    """The rewrites applying the actions of ``graph``'s intervene nodes at their producers,
    and the interventions on computed points by point (their saved values are changed):
    those points stand in for model values (:mod:`~clouseau.capture.jax.decompose`)."""
    decompose.check_grads(graph)
    rewrites = []
    for node in graph.interventions:
        ref = producer_of(graph, node.inputs[0])
        if is_computed(graph.node(ref.node)):
            continue  # the rewrite of the value it stands in for, below
        fn = partial(actions[node.name].apply, ops=_OPS)
        rewrites.append(Rewrite(graph.node(ref.node).key, ref.index, fn))
    fns = {name: partial(action.apply, ops=_OPS) for name, action in actions.items()}
    stand_ins, changed = decompose.lowered(graph, traced.jaxpr, fns)
    return (*rewrites, *stand_ins), changed


def grad_emitting(
    traced: Traced,
    plan: Plan,
    graph: Graph,
    graph_id: int,
    sink: Sink,
    changed: Mapping[str, Callable[[Any], Any]],
) -> Any:
    """The ``emitting`` function of a graph with save_grad nodes (see the module docs);
    ``changed``: the interventions on computed points, by point."""
    closed = traced.jaxpr
    sites = []
    kernels: dict[str, dict[str, tuple[str, ...]]] = {}  # a pattern's taps, by kernel
    for node in graph.grad_saves:
        ref = producer_of(graph, node.inputs[0])
        target = graph.node(ref.node)
        key = target.key
        names = node.names
        if is_computed(target):  # a pattern or scores (decompose.check_grads refused views)
            key = graph.node(str(target.attr("kernel"))).key
        if loops(graph, key):
            warnings.warn(
                f"clouseau does not save the gradient of {names[0][: -len('.grad')]!r}: it is "
                "computed inside a lax.scan or while_loop body",
                stacklevel=2,
            )
            continue
        if is_computed(target):
            kernels.setdefault(str(target.attr("kernel")), {})[target.name] = names
            continue
        sites.append((key, ref.index, names, ref.node))
    kernel_taps = {k: (kernel_points(graph, {k})[k], t) for k, t in kernels.items()}
    stream = Stream(emit=stream_emitter(plan, sink, graph_id))

    def emitting(*arrays: Any) -> list[Any]:
        call = begin_call(sink)
        taps = [
            Rewrite(key, output, tap(partial(put_grad, sink, graph_id, names, node), call))
            for key, output, names, node in sites
        ]
        for kernel, (points, tapped_names) in kernel_taps.items():
            fns = {
                point: tap(partial(put_grad, sink, graph_id, names, point), call)
                for point, names in tapped_names.items()
            }
            run = decompose.decomposed(graph, closed, points, changed, fns)
            taps.append(decompose.gradient(graph.node(kernel).key, run))
        tapped = plan.with_rewrites(taps)
        outs, saved = run_call(closed, tapped, arrays, replace(stream, call=call), graph)
        values = [jax.lax.stop_gradient(v) for v in saved]
        emitter(partial(receivers.deliver, sink, graph_id, plan, plan.top))(call, *values)
        return outs

    return jax.jit(emitting)


def tap(host: Callable[..., None], call: Any) -> Callable[[Any], Any]:
    """An identity on values whose backward hands the cotangent to ``host(nbatch, call, g)``."""
    return lambda value: _tap(host, value, call)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _tap(host: Callable[..., None], value: Any, call: Any) -> Any:
    return value


def _tap_fwd(host: Callable[..., None], value: Any, call: Any) -> tuple[Any, Any]:
    return value, call


def _tap_bwd(host: Callable[..., None], call: Any, cotangent: Any) -> tuple[Any, None]:
    emitter(host)(call, cotangent)
    return cotangent, None


_tap.defvjp(_tap_fwd, _tap_bwd)


def put_grad(
    sink: Sink, graph_id: int, names: tuple[str, ...], node: str, nbatch: int, call: Any, grad: Any
) -> None:
    """Host side of a tap: one gradient, into the call its forward pass began."""
    del nbatch  # the gradient has the batch axes the value had: nothing to split
    sink.put(int(call), graph_id, [SavedValue(names, node, np.array(grad, copy=True))])
