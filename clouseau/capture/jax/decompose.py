"""Interventions and gradients on computed points (JAX): the stand-ins of
:mod:`clouseau.ir.computed_interventions` lowered as :class:`~clouseau.capture.jax.plan.Rewrite` s.

A computed point feeds nothing in the model (:mod:`~clouseau.capture.jax.computed`). An
intervention on one reaches the model where the point stands in for a model value
(:func:`~clouseau.ir.computed_interventions.stand_ins`):

- a fused kernel's ``scores`` / ``pattern`` (``jax.nn.dot_product_attention``): the
  kernel's output is replaced by its decomposition
  (:func:`clouseau.ir.computed_attention.decomposition`), evaluated in ``jnp`` from the
  kernel's own inputs at the kernel's equation: the scores (scale, causality, mask or
  bias), the softmax, the intervention, ``@ v``. The scores and pattern it computes are
  the saved ones (the pattern the model read);
- ``attn.head_out``: the output projection's output is recomputed as the intervened heads
  summed plus the bias (:func:`clouseau.ir.computed_views.recomposition`), from the
  values the point reads (``z``, the projection's weights), read from internal slots
  (inside a ``lax.scan``, ``cond`` or ``while_loop`` body, per iteration, where those
  values are computed in the same body);
- ``logit_lens``: nothing reads it; the intervention changes its saved value only
  (:attr:`~clouseau.capture.jax.plan.Computed.change`).

Each rewrite runs wherever its equation runs (``jit``, ``vmap``, ``grad``, per iteration
inside ``lax.scan``). Numerics: the decomposition rounds differently from the fused kernel
(about 1e-6 in float32), so even an identity intervention is not bitwise.

``grads=`` on a pattern: the output stays the kernel's, bit for bit, and the backward
pass goes through the decomposition instead, with a gradient tap on the pattern:
``stop_gradient(out) + (d - stop_gradient(d))`` is ``out`` forward and ``d``'s gradient
backward. A view (the logit lens, per-head outputs) feeds nothing the model computes, so
its gradient is refused with the point to ask for instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from clouseau.capture.jax.computed import (
    READ_AT,
    equation_at,
    evaluate,
    intervened_kernels,
    reads,
    softmax,
)
from clouseau.capture.jax.keys import CONTROL, REMAT, enclosing
from clouseau.capture.jax.plan import Rewrite
from clouseau.ir.computed import is_computed
from clouseau.ir.computed_attention import decomposition
from clouseau.ir.computed_interventions import StandIn, stand_ins, view_grad_error
from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import Graph, Node, NodeKind, Ref
from clouseau.ir.passes import producer_of

Fn = Callable[[Any], Any]


def check_grads(graph: Graph) -> None:
    """Refuse ``grads=`` on a computed view: nothing in the model reads it."""
    for node in graph.grad_saves:
        target = graph.node(_computed_of(graph, node.inputs[0]))
        if is_computed(target) and not isinstance(target.attr("kernel"), str):
            raise view_grad_error(target.name, "JAX")


def _computed_of(graph: Graph, ref: Ref) -> str:
    """The node whose value ``ref`` is: an intervene node's target, else ``ref``'s node."""
    node = graph.node(ref.node)
    return node.inputs[0].node if node.kind is NodeKind.INTERVENE else node.name


def lowered(
    graph: Graph, closed: Any, actions: Mapping[str, Fn]
) -> tuple[tuple[Rewrite, ...], dict[str, Fn]]:
    """The rewrites of the interventions on computed points, and those interventions by
    point (``actions``: by intervene node name); raises what ``stand_ins`` refuses."""
    found = stand_ins(graph)
    changed = {s.point: actions[s.intervene] for s in found}
    rewrites = []
    kernels = intervened_kernels(graph)  # one rewrite per kernel, for its scores and pattern
    for kernel, points in kernels.items():
        run = decomposed(graph, closed, points, changed)
        rewrites.append(intervention(graph.node(kernel).key, run))
    for stand_in in found:
        if stand_in.program is not None and stand_in.replaces not in kernels:
            rewrites.append(_recomposed(graph, closed, stand_in, changed[stand_in.point]))
    return tuple(rewrites), changed


def _recomposed(graph: Graph, closed: Any, stand_in: StandIn, change: Fn) -> Rewrite:
    """The model value ``stand_in`` replaces (a projection's output) recomputed from the
    intervened point (a head_out), itself computed from the values it reads."""
    point, program = graph.node(stand_in.point), stand_in.program
    assert program is not None and stand_in.replaces is not None
    target = graph.node(stand_in.replaces)
    changed = Ref(stand_in.intervene)
    needed = (*reads(graph, point), *(r for r in reads(graph, program) if r != changed))
    needed = tuple(dict.fromkeys(needed))
    # A body (scan, cond, while, remat) fills its own slots: the rewrite of a projection
    # in one, run per iteration, reads them only where every value it reads is in it too.
    opened = {n.key for n in graph.nodes if n.op in CONTROL | REMAT}
    body = _body(graph, Ref(target.name), opened)
    if any(_body(graph, r, opened) != body for r in needed):
        raise SelectionError(
            f"clouseau cannot intervene on {point.name!r} in JAX: its projection is inside a "
            "lax.scan, cond, while_loop or checkpoint body and is recomputed from values "
            "outside that body. Intervene on blocks.*.attn.z (a head's slice of it) or on "
            "blocks.*.attn_out."
        )

    def fn(value: Any, *values: Any) -> Any:
        by_ref = dict(zip(needed, values, strict=True))
        by_ref[changed] = change(evaluate(graph, point, by_ref, closed))
        return evaluate(graph, program, by_ref, closed)

    return Rewrite(target.key, 0, fn, reads=needed)


def _body(graph: Graph, ref: Ref, opened: set[str]) -> tuple[str, ...]:
    """The keys of the opened equations (:data:`CONTROL`, :data:`REMAT`) around ``ref``."""
    key = graph.node(producer_of(graph, ref).node).key
    return tuple(k for k in enclosing(key) if k in opened)


def decomposed(
    graph: Graph,
    closed: Any,
    points: Mapping[str, Node],
    changed: Mapping[str, Fn],
    taps: Mapping[str, Fn] | None = None,
) -> Callable[[list[Any]], list[Any]]:
    """The decomposition of the kernel of ``points`` (its computed ``scores`` and
    ``pattern``, by what): from the kernel's inputs, its output and the scores and pattern
    the model reads (``changed``: the interventions by point name; ``taps``: the gradient
    taps by point name, after the change)."""
    kernel = graph.node(str(next(iter(points.values())).attr("kernel")))
    eqn = equation_at(closed.jaxpr, kernel.key)
    held = [i for i, var in enumerate(eqn.invars) if type(var).__name__ != "Literal"]
    if len(held) != len(kernel.inputs):
        raise SelectionError(f"clouseau cannot rebuild the inputs of the kernel {kernel.name!r}")
    last = points.get("pattern", points.get("scores"))
    assert last is not None
    program = decomposition(graph, last, Ref(last.name), f"{last.name}.decomposed")
    if program is None:
        raise SelectionError(
            f"clouseau cannot intervene on {last.name!r}: its kernel's output is not the "
            "pattern applied to its values in a layout clouseau can rebuild. Call "
            "jax.nn.dot_product_attention(q, k, v, ...) with [batch, pos, head, d_head] arrays."
        )
    taps = taps or {}

    def point(what: str, value: Any, by_ref: Mapping[Ref, Any]) -> Any:
        node = points[what]
        if value is None:
            value = evaluate(graph, node, {r: by_ref[r] for r in node.inputs}, closed)
        value = changed[node.name](value) if node.name in changed else value
        return taps[node.name](value) if node.name in taps else value

    def run(inputs: list[Any]) -> list[Any]:
        by_ref = {ref: inputs[i] for ref, i in zip(kernel.inputs, held, strict=True)}
        scores = point("scores", None, by_ref) if "scores" in points else None
        pattern = None
        if "pattern" in points:
            pattern = point("pattern", None if scores is None else softmax(scores), by_ref)
        weights = pattern if pattern is not None else scores
        values = {program.inputs[0]: weights, program.inputs[1]: by_ref[program.inputs[1]]}
        out = evaluate(graph, program, values, closed)
        read = [None] * len(READ_AT)
        read[READ_AT["scores"]], read[READ_AT["pattern"]] = scores, pattern
        return [out, *read]

    return run


def intervention(key: str, run: Callable[[list[Any]], list[Any]]) -> Rewrite:
    """The kernel at ``key`` replaced by its decomposition ``run`` (see :func:`decomposed`)."""
    return Rewrite(key, 0, lambda outputs, inputs: run(list(inputs)), inputs=True)


def gradient(key: str, run: Callable[[list[Any]], list[Any]]) -> Rewrite:
    """The kernel at ``key`` unchanged forward, differentiated through ``run`` (with taps)."""

    def fn(outputs: list[Any], inputs: list[Any]) -> list[Any]:
        found = run(list(inputs))
        d, out = found[0], jax.lax.stop_gradient(outputs[0])
        return [out + (d - jax.lax.stop_gradient(d)), *outputs[1:]]

    return Rewrite(key, 0, fn, inputs=True)
