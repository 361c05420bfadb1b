"""Where computed points go in a lowered graph, and the interventions on them.

An intervention on a fused kernel's computed ``pattern`` (or ``scores``) replaces the
kernel by its decomposition (:func:`clouseau.ir.computed_attention.decomposition`), so
the intervened value is what the model reads; any other computed point is a view the
model never reads, and an intervention on it is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch.fx as fx

from clouseau.capture.torch.lowering.computed import lower_computed, replayed, softmax_node
from clouseau.ir.computed import is_computed
from clouseau.ir.computed_attention import decomposition
from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import INSTRUMENTATION, AttrValue, Graph, Node


def decomposable(node: Node) -> bool:
    """Whether an intervention on computed point ``node`` replaces a kernel (a pattern)."""
    return node.attr("kernel") is not None


def check_not_intervened(graph: Graph) -> None:
    """Refuse an intervention on a computed point the model never reads, and two
    interventions on one kernel's scores and pattern."""
    kernels: dict[str, str] = {}
    for node in graph.interventions:
        target = graph.node(node.inputs[0].node)
        if not is_computed(target):
            continue
        if not decomposable(target):
            raise SelectionError(
                f"cannot intervene on {target.name!r}: it is a view computed beside the model "
                "(a logit lens, a per-head output, a layout the model never builds), which "
                "the model never reads, so changing it would change nothing the model "
                "computes. Intervene on the value it is computed from (blocks.*.resid_post, "
                "blocks.*.attn.z, blocks.*.attn_out, blocks.*.attn.pattern)."
            )
        kernel = str(target.attr("kernel"))
        if kernel in kernels:
            raise SelectionError(
                f"cannot intervene on both {kernels[kernel]!r} and {target.name!r}: both "
                "replace the same attention kernel by its decomposition. Intervene on one "
                "of them (compose the changes in one clouseau.replace(fn) on the pattern)."
            )
        kernels[kernel] = target.name


def lower_computed_points(
    graph: Graph,
    fx_graph: fx.Graph,
    values: dict[str, fx.Node],
    fx_nodes: Mapping[str, fx.Node],
) -> dict[str, fx.Node]:
    """Emit the computed points that a save or an intervention reads; add their fx nodes
    to ``values``."""
    needed = {r.node for n in graph.nodes if n.kind in INSTRUMENTATION for r in n.inputs}
    keys = {n.name: n.key for n in graph.nodes if n.key}
    order = {n: i for i, n in enumerate(fx_graph.nodes)}
    placeholders = [n for n in fx_graph.nodes if n.op == "placeholder"]
    emitted: dict[str, fx.Node] = {}
    scores: dict[AttrValue, fx.Node] = {}  # by kernel: its computed scores, where emitted
    for node in graph.nodes:
        if not is_computed(node) or node.name not in needed:
            continue
        kernel, what = node.attr("kernel"), node.attr("attention")
        if what == "pattern" and kernel in scores:
            # Both selected: the pattern is the softmax of the scores, not a second q @ k^T.
            with fx_graph.inserting_before(scores[kernel].next):
                emitted[node.name] = softmax_node(fx_graph, scores[kernel])
            values[node.name] = emitted[node.name]
            continue
        inputs = [values[r.node] for r in node.inputs]
        # After its inputs and every node it replays (a replay reads what they read).
        reads = inputs + [fx_nodes[keys[name]] for name in replayed(node)]
        anchor = max(reads, key=order.__getitem__)
        if anchor.op == "placeholder":
            anchor = placeholders[-1]
        with fx_graph.inserting_before(anchor.next):
            emitted[node.name] = lower_computed(fx_graph, node, inputs, fx_nodes, keys)
        values[node.name] = emitted[node.name]
        if what == "scores":
            scores[kernel] = emitted[node.name]
    return emitted


def decompose_intervened(
    graph: Graph, fx_graph: fx.Graph, values: dict[str, fx.Node], fx_nodes: Mapping[str, fx.Node]
) -> None:
    """Replace the kernel of each intervened pattern by its decomposition, which reads the
    intervened value (``values``: the fx node of each IR value, the intervened ones too)."""
    keys = {n.name: n.key for n in graph.nodes if n.key}
    for node in graph.interventions:
        target = graph.node(node.inputs[0].node)
        if not (is_computed(target) and decomposable(target)):
            continue
        kernel_name = str(target.attr("kernel"))
        kernel = values[kernel_name]
        program = decomposition(graph, target, node.inputs[0], f"{target.name}.decomposed")
        if program is None:
            raise SelectionError(
                f"cannot intervene on {target.name!r}: its kernel's output is not the "
                "pattern applied to its values in a layout clouseau can rebuild. Load the "
                "model with attn_implementation='eager' to intervene on its own pattern."
            )
        inputs = [values[node.name], values[program.inputs[1].node]]
        # Right after the kernel: its inputs, the pattern and the intervention come before.
        with fx_graph.inserting_before(kernel.next):
            out = lower_computed(fx_graph, program, inputs, fx_nodes, keys)
        kernel.replace_all_uses_with(out)
        fx_graph.erase_node(kernel)
        values[kernel_name] = out
