"""``blocks.{i}.attn.head_out`` as one batched matmul per layer.

The IR program of ``head_out`` (:func:`clouseau.ir.computed_views.head_out`) replays the
output projection once per head on ``z`` with the other heads zeroed, and once on zeros
for the bias: as many projections as heads, plus one. Where the projection is one
``linear`` or ``addmm`` between reshapes of ``z``'s ``[batch, pos, head, d_head]``, each
head's share is its slice of ``z`` times its rows of the weight, all heads in one
``einsum`` (a batched matmul over heads: the projection's FLOPs, once), no per-head copy
of ``z``. To rounding the same values (the bias is not added and taken off again).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.fx as fx

from clouseau.ir.computed import Op, program_of
from clouseau.ir.graph import Graph, Node, TensorSpec

#: IR ops of the reshapes around the projection (shapes only, no arithmetic).
_RESHAPES = frozenset({"reshape", "view", "flatten", "contiguous", "_unsafe_view"})


def heads_matmul(z: torch.Tensor, weight: torch.Tensor, out_in: bool) -> torch.Tensor:
    """Each head's ``z`` through its rows of ``weight`` (``[out, in]`` with ``out_in``,
    else ``[in, out]``): ``[batch, pos, head, d_out]``."""
    heads, depth = z.shape[-2:]
    w = weight.t() if out_in else weight
    return torch.einsum("...hd,hdm->...hm", z, w.reshape(heads, depth, w.shape[-1]))


def heads_summed(value: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The projection's output from per-head outputs ``value`` (``[batch, pos, head,
    d_out]``): their sum plus the bias (what the projection of zeros is, exactly)."""
    summed = value.sum(2)
    return summed if bias is None else summed + bias


def heads_projected(
    graph: Graph,
    fx_graph: fx.Graph,
    point: Node,
    z: fx.Node,
    fx_nodes: Mapping[str, fx.Node],
) -> fx.Node | None:
    """``point``'s value as one :func:`heads_matmul` (at ``fx_graph``'s insertion point),
    or None where its projection is not one ``linear`` / ``addmm`` between reshapes."""
    found = _projection(graph, point)
    weight = None if found is None else _param(fx_graph, found, fx_nodes[found.key], 1)
    if weight is None:
        return None
    return fx_graph.call_function(heads_matmul, (z, *weight))


def heads_recomposed(
    graph: Graph,
    fx_graph: fx.Graph,
    point: Node,
    value: fx.Node,
    fx_nodes: Mapping[str, fx.Node],
) -> fx.Node | None:
    """The projection's output from ``value`` in place of ``point`` (a ``head_out``), as
    :func:`heads_summed` with the projection's own bias, or None (see
    :func:`heads_projected`): no projection of zeros for the bias."""
    found = _projection(graph, point)
    bias = None if found is None else _param(fx_graph, found, fx_nodes[found.key], 0)
    if bias is None:
        return None
    return fx_graph.call_function(heads_summed, (value, bias[0]))


def _projection(graph: Graph, point: Node) -> Node | None:
    """The one ``linear`` / ``addmm`` a ``head_out`` replays between reshapes of its ``z``
    (``[batch, pos, head, d_head]``), or None."""
    if point.attr("view") != "head_out":
        return None
    steps = program_of(point).nodes
    keep = next((s for s in steps if s.op == Op.KEEP.value), None)
    replay = next((s for s in steps if s.op == Op.REPLAY.value), None)
    z_spec = graph.node(point.inputs[0].node).outputs[point.inputs[0].index]
    if keep is None or replay is None or keep.attr("axis") != 2:
        return None
    if not isinstance(z_spec, TensorSpec) or len(z_spec.shape) != 4:
        return None
    chain = [graph.node(str(n)) for n in replay.attr("nodes") or ()]
    found = [n for n in chain if n.op not in _RESHAPES]
    if len(found) != 1 or found[0].op not in ("linear", "addmm"):
        return None
    return found[0] if _merges_heads(z_spec, chain, found[0]) else None


def _merges_heads(z: TensorSpec, chain: list[Node], projection: Node) -> bool:
    """Whether the chain reshapes ``z`` to rows of ``head * d_head`` (leading axes
    merged or kept), projects them, and reshapes back to ``z``'s leading axes."""
    lead, width = z.shape[:-2], z.shape[-2] * z.shape[-1]
    index = chain.index(projection)
    before = [n.outputs[0] for n in chain[:index]]
    after = chain[-1].outputs[0]
    rows = {lead, (math.prod(lead),)}
    return (
        bool(before)
        and all(isinstance(s, TensorSpec) and s.shape[-1] == width for s in before)
        and all(isinstance(s, TensorSpec) and s.shape[:-1] in rows for s in before)
        and isinstance(after, TensorSpec) and after.shape[:-1] == lead
    )  # fmt: skip


def _param(
    fx_graph: fx.Graph, ir: Node, node: fx.Node, which: int
) -> tuple[fx.Node | None, bool] | None:
    """The projection's weight (``which`` 1: its node and whether it is ``[out, in]``) or
    bias (0: its node, None where it has none), or None where it cannot say."""
    if ir.op == "linear" and node.op == "call_module":
        return fx_graph.get_attr(f"{node.target}.{('bias', 'weight')[which]}"), True
    if ir.op == "linear" and node.op == "call_function" and not node.kwargs:
        # linear(x, weight, bias=None), its arguments positional
        found = node.args[(2, 1)[which]] if len(node.args) > (2, 1)[which] else None
        if isinstance(found, fx.Node) or (found is None and which == 0):
            return found, True
        return None
    if ir.op == "addmm" and node.op == "call_function" and len(node.args) == 3 and not node.kwargs:
        found = node.args[(0, 2)[which]]  # addmm(bias, x, weight): x @ weight + bias
        return (found, False) if isinstance(found, fx.Node) else None
    return None
