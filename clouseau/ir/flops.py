"""FLOP estimates of IR nodes, keyed on the op category a frontend gives each node.

The IR does not know how torch or JAX spell an op (``addmm``, ``dot_general``,
``reduce_window_max``): each frontend says, when it builds the graph, which
:class:`OpCategory` a node's op is (``clouseau/capture/torch/flop_ops.py``,
``clouseau/capture/jax/flop_ops.py``) and stores it with :func:`category_attr`. The rules
here read only the category, the node's input and output shapes and a few framework-free
attributes the frontends set (a conv's ``in_channels``/``kernel_size``/``groups``, a
``dot_general``'s ``lhs_contracting_dims``, a pooling ``window_dimensions``).

FLOPs count a multiply-add as 2 and ignore biases, as the textbook formulas do:

=====================  ================================================================
category               FLOPs
=====================  ================================================================
matmul                 2 * K * numel(out), K the last axis of the first operand
                       (linear: 2 * in * out * batch)
addmm                  2 * K * numel(out), K the last axis of the second operand
dot_general            2 * K * numel(out) (K: the contracted size)
conv (1/2/3-d)         2 * Cin/groups * prod(kernel) * numel(out)
                       (= 2 * Cin/groups * kh * kw * Cout * Hout * Wout * N)
conv_transpose         2 * Cout/groups * prod(kernel) * numel(in)
attention              in/out projections 2*E*(nq + nk + nv + nq), scores and
                       weighted sum 4 * nq * S  (n: numel, S: key length)
sdpa                   4 * numel(q) * S
norm, softmax          5 per element; batch_norm 4
elementwise            1 per element of the largest operand (add, mul, relu, exp, ...)
reduction, pool        1 per input element (reduce_window: per output * window)
free, loop             0 (reshapes, indexing, data movement, graph plumbing; a loop's
                       own node: its body's nodes count)
no category            unknown (None), left out of totals
=====================  ================================================================

A graph saved before the frontends set categories has none: its FLOPs are unknown.
Nodes inside a loop body (a ``lax.scan``: category ``loop``, keys as :mod:`clouseau.ir.keys`
nests them) run once per iteration: :func:`total_flops` multiplies them by the loop's
``length``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from typing import Any

from clouseau.ir.graph import INSTRUMENTATION, AttrValue, Graph, Node, NodeKind, Spec, TensorSpec
from clouseau.ir.keys import enclosing

#: The node attribute holding the category (hidden: the printer skips ``_`` attributes).
CATEGORY = "_op_category"


class OpCategory(enum.Enum):
    """What an op computes, as far as counting its FLOPs goes (see the module docs)."""

    FREE = "free"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    ADDMM = "addmm"
    DOT_GENERAL = "dot_general"
    CONV = "conv"
    CONV_TRANSPOSE = "conv_transpose"
    ATTENTION = "attention"
    SDPA = "sdpa"
    NORM = "norm"
    SOFTMAX = "softmax"
    BATCH_NORM = "batch_norm"
    POOL = "pool"
    REDUCE_WINDOW = "reduce_window"
    LOOP = "loop"  # a loop of known length (attr ``length``): its body runs that many times


def category_attr(category: OpCategory | None) -> tuple[tuple[str, AttrValue], ...]:
    """The node attributes that record ``category`` (none for an op without a rule)."""
    return () if category is None else ((CATEGORY, category.value),)


def op_category(node: Node) -> OpCategory | None:
    """The category a frontend gave ``node``, or None."""
    value = node.attr(CATEGORY)
    return None if value is None else OpCategory(value)


def _tensors(specs: Iterable[Spec]) -> list[TensorSpec]:
    return [s for s in specs if isinstance(s, TensorSpec)]


def input_specs(graph: Graph, node: Node) -> tuple[Spec, ...]:
    """The specs of the values ``node`` reads, in order."""
    return tuple(graph.node(r.node).outputs[r.index] for r in node.inputs)


def node_flops(graph: Graph, node: Node) -> int | None:
    """An estimate of the FLOPs of one execution of ``node`` (see the module docs).

    Returns
    -------
    int or None
        None when the node has no category; 0 for data movement and graph plumbing.
    """
    if node.kind in INSTRUMENTATION or node.kind in (NodeKind.INPUT, NodeKind.CONSTANT):
        return 0
    if node.kind is NodeKind.OUTPUT:
        return 0
    category = op_category(node)
    if category is None:
        return None
    try:
        return _RULES[category](node, _tensors(input_specs(graph, node)), _tensors(node.outputs))
    except (IndexError, ZeroDivisionError, TypeError, ValueError):
        return None  # a shape the rule does not expect (a scalar, an odd layout)


Rule = Callable[[Node, list[TensorSpec], list[TensorSpec]], int]


def _ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _conv(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    out = outs[0]
    in_channels, kernel = node.attr("in_channels"), node.attr("kernel_size")
    if in_channels is not None and kernel is not None:
        groups = int(node.attr("groups", 1))  # type: ignore[arg-type]
        per_output = int(in_channels) // groups * math.prod(_ints(kernel))  # type: ignore[arg-type]
    else:
        # The weight is an input (F.conv2d, lax.conv): Cout x Cin/groups x kernel.
        weight = ins[1]
        out_dim = int(node.attr("rhs_out_dim", 0))  # type: ignore[arg-type]
        per_output = weight.numel // weight.shape[out_dim]
    return 2 * per_output * out.numel


def _conv_transpose(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    out_channels, kernel = node.attr("out_channels"), node.attr("kernel_size")
    if out_channels is not None and kernel is not None:
        groups = int(node.attr("groups", 1))  # type: ignore[arg-type]
        per_input = int(out_channels) // groups * math.prod(_ints(kernel))  # type: ignore[arg-type]
    else:
        weight = ins[1]  # Cin x Cout/groups x kernel
        per_input = weight.numel // weight.shape[0]
    return 2 * per_input * ins[0].numel


def _dot_general(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    contract = node.attr("lhs_contracting_dims")
    if contract is not None:
        k = math.prod(ins[0].shape[d] for d in _ints(contract))
    else:
        # Without batch dims numel(lhs) * numel(rhs) = numel(out) * K^2.
        k = math.isqrt(ins[0].numel * ins[1].numel // outs[0].numel)
    return 2 * k * outs[0].numel


def _attention(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    q, k, v = ins[:3]
    embed = q.shape[-1]
    seq_axis = 1 if node.attr("batch_first", False) and len(k.shape) == 3 else 0
    keys = k.shape[seq_axis]
    projections = 2 * embed * (q.numel + k.numel + v.numel + q.numel)
    return projections + 4 * q.numel * keys


def _per_element(factor: int) -> Rule:
    return lambda node, ins, outs: factor * (outs or ins)[0].numel


def _largest(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    return max(s.numel for s in (*ins, *outs)) if outs else 0


def _reduce_window(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    return outs[0].numel * math.prod(node.attr("window_dimensions"))  # type: ignore[arg-type]


_RULES: dict[OpCategory, Rule] = {
    OpCategory.FREE: lambda node, ins, outs: 0,
    OpCategory.ELEMENTWISE: _largest,
    OpCategory.REDUCTION: _largest,
    OpCategory.MATMUL: lambda node, ins, outs: 2 * ins[0].shape[-1] * outs[0].numel,
    OpCategory.ADDMM: lambda node, ins, outs: 2 * ins[1].shape[-1] * outs[0].numel,
    OpCategory.DOT_GENERAL: _dot_general,
    OpCategory.CONV: _conv,
    OpCategory.CONV_TRANSPOSE: _conv_transpose,
    OpCategory.ATTENTION: _attention,
    OpCategory.SDPA: lambda node, ins, outs: 4 * ins[0].numel * ins[1].shape[-2],
    OpCategory.NORM: _per_element(5),
    OpCategory.SOFTMAX: _per_element(5),
    OpCategory.BATCH_NORM: _per_element(4),
    OpCategory.POOL: lambda node, ins, outs: ins[0].numel,
    OpCategory.REDUCE_WINDOW: _reduce_window,
    OpCategory.LOOP: lambda node, ins, outs: 0,
}


def loop_factor(graph: Graph) -> dict[str, int]:
    """How many times each node runs per call: the product of its enclosing loop lengths."""
    lengths = {
        n.key: int(n.attr("length", 1))  # type: ignore[arg-type]
        for n in graph.nodes
        if n.key and op_category(n) is OpCategory.LOOP
    }
    factors: dict[str, int] = {}
    for node in graph.nodes:
        factor = 1
        for outer in enclosing(node.key) if lengths and node.key else ():
            factor *= lengths.get(outer, 1)
        factors[node.name] = factor
    return factors


def total_flops(graph: Graph, nodes: Iterable[Node] | None = None) -> int:
    """The FLOPs of one call (nodes with no rule count 0), loop iterations included."""
    factors = loop_factor(graph)
    total = 0
    for node in graph.nodes if nodes is None else nodes:
        flops = node_flops(graph, node)
        total += (flops or 0) * factors.get(node.name, 1)
    return total
