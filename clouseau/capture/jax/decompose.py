"""Interventions and gradients on a fused kernel's computed ``scores`` and ``pattern`` (JAX).

``jax.nn.dot_product_attention`` never materializes its pattern: the pattern is computed
beside it (:mod:`~clouseau.capture.jax.computed`). An intervention on it replaces the
kernel's output by its decomposition (:func:`clouseau.ir.computed_attention.decomposition`),
evaluated in ``jnp`` from the kernel's own inputs: the scores (scale, causality, mask or
bias), the softmax, the intervention, ``@ v``, so the changed pattern is what the model
reads. A :class:`~clouseau.capture.jax.plan.Rewrite` with ``inputs`` does it at the
kernel's equation, so it runs wherever the kernel runs (``jit``, ``vmap``, ``grad``, per
iteration inside ``lax.scan``); the scores and pattern it computes are the saved ones.
Numerics: the decomposition rounds differently from the fused kernel (about 1e-6 in
float32), so even an identity intervention is not bitwise.

``grads=`` on a pattern: the output stays the kernel's, bit for bit, and the backward
pass goes through the decomposition instead, with a gradient tap on the pattern:
``stop_gradient(out) + (d - stop_gradient(d))`` is ``out`` forward and ``d``'s gradient
backward. A view (the logit lens, per-head outputs, a layout) feeds nothing the model
computes, so its gradient is refused with the point to ask for instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from clouseau.capture.jax.computed import READ_AT, equation_at, evaluate, softmax
from clouseau.capture.jax.plan import Rewrite
from clouseau.ir.computed import is_computed
from clouseau.ir.computed_attention import decomposition
from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import Graph, Node, NodeKind, Ref

Fn = Callable[[Any], Any]


def check(graph: Graph) -> None:
    """Refuse an intervention or ``grads=`` on a computed view (nothing in the model reads
    it), and two interventions on one kernel's scores and pattern."""
    kernels: dict[str, str] = {}
    for node in graph.interventions:
        target = graph.node(node.inputs[0].node)
        if not is_computed(target):
            continue
        kernel = target.attr("kernel")
        if not isinstance(kernel, str):
            raise _view_error(target.name, "intervene on")
        if kernel in kernels:
            raise SelectionError(
                f"clouseau cannot intervene on both {kernels[kernel]!r} and {target.name!r}: "
                "both replace the same attention kernel by its decomposition. Intervene on "
                "one of them (compose the changes in one clouseau.replace(fn) on the pattern)."
            )
        kernels[kernel] = target.name
    for node in graph.grad_saves:
        target = graph.node(_computed_of(graph, node.inputs[0]))
        if is_computed(target) and not isinstance(target.attr("kernel"), str):
            raise _view_error(target.name, "take the gradient of")


def _view_error(name: str, doing: str) -> SelectionError:
    return SelectionError(
        f"clouseau cannot {doing} {name!r} in JAX: it is a view computed beside the model "
        "(a logit lens, a per-head output, a layout the model never builds), which the "
        "model never reads, so nothing the model computes depends on it. Select the value "
        "it is computed from instead (blocks.*.resid_post, blocks.*.attn.z, "
        "blocks.*.attn_out, blocks.*.attn.pattern)."
    )


def _computed_of(graph: Graph, ref: Ref) -> str:
    """The node whose value ``ref`` is: an intervene node's target, else ``ref``'s node."""
    node = graph.node(ref.node)
    return node.inputs[0].node if node.kind is NodeKind.INTERVENE else node.name


def changes(graph: Graph, actions: Mapping[str, Fn]) -> dict[str, Fn]:
    """The intervention on each computed point (``actions``: by intervene node name)."""
    return {
        node.inputs[0].node: actions[node.name]
        for node in graph.interventions
        if is_computed(graph.node(node.inputs[0].node))
    }


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
