"""Computed attention points: q, k, v, z in ``[batch, pos, head, d_head]``, and the scores
and pattern of a fused kernel, computed beside it from its own inputs and options.

A fused kernel's node carries its options as attrs (set by the frontend that traced it):
``scale`` (None: ``1/sqrt(d_head)``), ``is_causal``, ``mask`` (the index of its mask
among the node's inputs, -1 for none) and ``dropout_p``; ``layout="bshd"`` where it reads
``[batch, pos, head, d_head]`` (``jax.nn.dot_product_attention``). The pattern is
``softmax(q @ k^T * scale + mask)`` (each group of grouped-query heads reading its key
head as it is), a boolean mask or causality filling ``-inf`` (TransformerLens' convention
for masked scores) and a float
mask (ALiBi, relative position biases, sliding windows) added: what the kernel computes
inside, so it equals the eager attention's weights to rounding.
"""

from __future__ import annotations

import math

from clouseau.ir.canonical_attention import Attention
from clouseau.ir.computed import Program
from clouseau.ir.graph import DType, Graph, Node, Ref, TensorSpec

#: The kernel attrs the frontend sets; without them a fused kernel's pattern is unknown.
KERNEL_ATTRS = ("scale", "is_causal", "mask", "dropout_p")


def attention_point(graph: Graph, attention: Attention, what: str, name: str) -> Node | None:
    """The computed point ``name`` for ``what`` of ``attention`` (None: not computable)."""
    kernel = graph.node(attention.kernel)
    if what in ("q", "k", "v", "z"):
        source = {"q": attention.q, "k": attention.k, "v": attention.v, "z": attention.out}[what]
        return _heads_last(graph, source, name, kernel.module)
    if what in ("scores", "pattern") and attention.fused:
        return _pattern(graph, kernel, attention, name, softmax=what == "pattern")
    return None


def _spec(graph: Graph, ref: Ref) -> TensorSpec | None:
    spec = graph.node(ref.node).outputs[ref.index]
    return spec if isinstance(spec, TensorSpec) else None


def _heads_last(graph: Graph, source: Ref, name: str, module: str) -> Node | None:
    spec = _spec(graph, source)
    if spec is None or len(spec.shape) != 4:
        return None
    program = Program((spec,))
    out = program.transpose(program.input(0), 1, 2)
    return program.node(name, out, inputs=(source,), module=module, attrs=(("view", "heads_last"),))


def heads_first(graph: Graph, point: Node, value: Ref, name: str) -> Node | None:
    """The model's ``[batch, head, pos, d_head]`` value that ``point`` (a computed
    ``[batch, pos, head, d_head]`` layout of it: q, k, v, z) stands in for, from ``value``
    in its place: ``value`` transposed back (exact). None: ``point`` is no such layout."""
    if point.attr("view") != "heads_last" or point.inputs[0].index:
        return None
    spec = _spec(graph, value)
    if spec is None or len(spec.shape) != 4:
        return None
    p = Program((spec,))
    return p.node(name, p.transpose(p.input(0), 1, 2), inputs=(value,), module=point.module)


def grouped_matmul(p: Program, x: Ref, y: Ref) -> Ref:
    """``x @ y`` over heads, where ``y`` has fewer (grouped-query) heads than ``x``.

    Each group of ``x``'s heads that share one of ``y``'s is one matrix of ``group * rows``
    rows: ``y`` is read as it is, never repeated per head.
    """
    xs, ys = p.spec(x).shape, p.spec(y).shape
    batch, heads, rows, _ = xs
    groups = ys[1]
    if groups == heads:
        return p.matmul(x, y)
    grouped = p.reshape(x, (batch, groups, heads // groups * rows, xs[-1]))
    return p.reshape(p.matmul(grouped, y), (batch, heads, rows, ys[-1]))


def _pattern(
    graph: Graph, kernel: Node, attention: Attention, name: str, *, softmax: bool
) -> Node | None:
    attrs = dict(kernel.attrs)
    if any(a not in attrs for a in KERNEL_ATTRS) or attrs["dropout_p"]:
        return None  # options unknown, or a dropout that no pattern can reproduce
    q, k = attention.q, attention.k
    q_spec, k_spec = _spec(graph, q), _spec(graph, k)
    if q_spec is None or k_spec is None or len(q_spec.shape) != 4 or len(k_spec.shape) != 4:
        return None
    inputs = [q, k]
    mask_at = attrs["mask"] if isinstance(attrs["mask"], int) else -1
    mask = kernel.inputs[mask_at] if 0 <= mask_at < len(kernel.inputs) else None
    mask_spec = _spec(graph, mask) if mask is not None else None
    specs = [q_spec, k_spec] + ([mask_spec] if mask_spec is not None else [])
    if mask is not None and mask_spec is not None:
        inputs.append(mask)
    p = Program(tuple(specs))
    query, key = p.input(0), p.input(1)
    if attrs.get("layout") == "bshd":  # jax's [batch, pos, head, d_head] kernel
        query, key = p.transpose(query, 1, 2), p.transpose(key, 1, 2)
        q_spec, k_spec = p.spec(query), p.spec(key)
    heads, kv_heads = q_spec.shape[1], k_spec.shape[1]
    if heads % kv_heads:
        return None
    scale = attrs["scale"]
    factor = float(scale) if scale is not None else 1.0 / math.sqrt(q_spec.shape[-1])
    scores = p.scale(grouped_matmul(p, query, p.transpose(key, -2, -1)), factor)
    if attrs["is_causal"]:
        scores = p.causal_fill(scores, "-inf")
    if mask_spec is not None:
        if mask_spec.dtype is DType.BOOL:
            scores = p.mask_fill(scores, p.input(2), "-inf")
        else:
            scores = p.add(scores, p.input(2))
    out = p.softmax(scores) if softmax else scores
    what = "pattern" if softmax else "scores"
    return p.node(
        name, out, inputs=tuple(inputs), module=kernel.module,
        attrs=(("kernel", kernel.name), ("attention", what)),
    )  # fmt: skip


def decomposition(graph: Graph, point: Node, value: Ref, name: str) -> Node | None:
    """What the fused kernel of ``point`` (a computed pattern or scores) computes, from
    ``value`` in its place: ``softmax(scores) @ v``, or ``pattern @ v``.

    The computation an intervention on a computed pattern runs instead of the kernel, so
    that the intervened value is what the model reads (``None``: ``point`` has no kernel).
    """
    kernel_name, what = point.attr("kernel"), point.attr("attention")
    if not isinstance(kernel_name, str) or what not in ("scores", "pattern"):
        return None
    kernel = graph.node(kernel_name)
    v, spec = kernel.inputs[2], _spec(graph, value)
    v_spec, out_spec = _spec(graph, v), _spec(graph, Ref(kernel.name))
    if spec is None or v_spec is None or out_spec is None or len(v_spec.shape) != 4:
        return None
    p = Program((spec, v_spec))
    weights = p.softmax(p.input(0)) if what == "scores" else p.input(0)
    bshd = kernel.attr("layout") == "bshd"  # jax's kernel: v and its output heads-third
    values = p.transpose(p.input(1), 1, 2) if bshd else p.input(1)
    out = grouped_matmul(p, weights, values)
    out = p.transpose(out, 1, 2) if bshd else out
    if p.spec(out).shape != out_spec.shape:
        return None
    return p.node(name, out, inputs=(value, v), module=kernel.module)
