"""Lowering of the intervene and save_grad IR nodes in the jaxpr rewrite.

An intervene node becomes a :class:`~clouseau.capture.jax.lower.Rewrite` of the value at
its producer's key: :func:`~clouseau.capture.jax.lower.run` replaces the value by
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
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from clouseau.capture.jax.jaxpr_trace import Traced
from clouseau.capture.jax.lower import Plan, Rewrite, Slot, deliver, loops, run
from clouseau.ir.actions import Action
from clouseau.ir.errors import TraceError
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


def intervention_rewrites(graph: Graph, actions: Mapping[str, Action]) -> tuple[Rewrite, ...]:
    """The rewrites applying the actions of ``graph``'s intervene nodes at their producers."""
    rewrites = []
    for node in graph.interventions:
        ref = producer_of(graph, node.inputs[0])
        fn = partial(actions[node.name].apply, ops=_OPS)
        rewrites.append(Rewrite(graph.node(ref.node).key, ref.index, fn))
    return tuple(rewrites)


def grad_emitting(traced: Traced, plan: Plan, graph: Graph, graph_id: int, sink: Sink) -> Any:
    """The ``emitting`` function of a graph with save_grad nodes (see the module docs)."""
    closed = traced.jaxpr
    sites = []
    for node in graph.grad_saves:
        ref = producer_of(graph, node.inputs[0])
        key = graph.node(ref.node).key
        names = tuple(str(n) for n in node.attr("names"))  # type: ignore[union-attr]
        if loops(graph, key):
            warnings.warn(
                f"clouseau does not save the gradient of {names[0][: -len('.grad')]!r}: it is "
                "computed inside a lax.scan body",
                stacklevel=2,
            )
            continue
        sites.append((key, ref.index, names, ref.node))

    def emitting(*arrays: Any) -> list[Any]:
        call = begin_call(sink)
        taps = [
            Rewrite(key, output, tap(partial(put_grad, sink, graph_id, names, node), call))
            for key, output, names, node in sites
        ]
        saved: dict[int, Any] = {}
        outs = run(closed.jaxpr, closed.consts, arrays, "", plan.with_rewrites(taps), saved)
        missing = [s.names[0] for i, s in enumerate(plan.slots) if i not in saved]
        if missing:
            raise TraceError(
                f"clouseau could not reach the selected points {missing} when rerunning the model"
            )
        values = [jax.lax.stop_gradient(saved[i]) for i in range(len(plan.slots))]
        emitter(partial(deliver_into, sink, graph_id, plan.slots))(call, *values)
        return outs

    return jax.jit(emitting)


def begin_call(sink: Sink) -> Any:
    """The sink's next call index, numbered on the host when the computation runs."""
    return io_callback(partial(_begin, sink), jax.ShapeDtypeStruct((), jnp.int32), ordered=False)


def _begin(sink: Sink) -> np.ndarray:
    return np.int32(sink.begin_call())


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


def emitter(host: Callable[..., None], nbatch: int = 0) -> Callable[..., Any]:
    """Hand ``(call, *arrays)`` to ``host(nbatch, call, *arrays)`` once per execution.

    As :func:`clouseau.capture.jax.lower._emitter`, with the call index as the first,
    never batched, argument: under ``vmap`` one host call gets the batch axes in front.
    """

    @jax.custom_batching.custom_vmap
    def emit(call: Any, *values: Any) -> tuple[()]:
        jax.debug.callback(partial(host, nbatch), call, *values)
        return ()

    @emit.def_vmap
    def _batched(
        axis_size: int, in_batched: list[bool], call: Any, *values: Any
    ) -> tuple[tuple[()], tuple[()]]:
        # One call index per execution: a batched copy of it holds the same number.
        index = call[0] if in_batched[0] else call
        full = [
            v if b else jnp.broadcast_to(v, (axis_size, *jnp.shape(v)))
            for v, b in zip(values, in_batched[1:], strict=True)
        ]
        emitter(host, nbatch + 1)(index, *full)
        return (), ()

    return emit


def put_grad(
    sink: Sink, graph_id: int, names: tuple[str, ...], node: str, nbatch: int, call: Any, grad: Any
) -> None:
    """Host side of a tap: one gradient, into the call its forward pass began."""
    del nbatch  # the gradient has the batch axes the value had: nothing to split
    sink.put(int(call), graph_id, [SavedValue(names, node, np.array(grad, copy=True))])


def deliver_into(
    sink: Sink, graph_id: int, slots: tuple[Slot, ...], nbatch: int, call: Any, *arrays: Any
) -> None:
    """:func:`~clouseau.capture.jax.lower.deliver` into the call :func:`begin_call` numbered."""
    deliver(sink, graph_id, slots, nbatch, *arrays, call=int(call))
