"""Where computed points go in a lowered graph, and the interventions they refuse."""

from __future__ import annotations

from collections.abc import Mapping

import torch.fx as fx

from clouseau.capture.torch.computed import lower_computed, replayed
from clouseau.ir.computed import is_computed
from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import INSTRUMENTATION, Graph


def check_not_intervened(graph: Graph) -> None:
    """Refuse an intervention on a computed point: the model never reads its value."""
    for node in graph.interventions:
        target = graph.node(node.inputs[0].node)
        if is_computed(target):
            raise SelectionError(
                f"cannot intervene on {target.name!r}: it is computed beside the model "
                "(a fused attention kernel's pattern, a layout the model never builds), so "
                "changing it would change nothing the model computes. Intervene on a value "
                "the model holds (blocks.*.attn.z, blocks.*.attn_out), or load the model "
                "with attn_implementation='eager' to intervene on its own pattern."
            )


def lower_computed_points(
    graph: Graph,
    fx_graph: fx.Graph,
    values: dict[str, fx.Node],
    fx_nodes: Mapping[str, fx.Node],
) -> dict[str, fx.Node]:
    """Emit the computed points that a save reads; add their fx nodes to ``values``."""
    needed = {r.node for n in graph.nodes if n.kind in INSTRUMENTATION for r in n.inputs}
    keys = {n.name: n.key for n in graph.nodes if n.key}
    order = {n: i for i, n in enumerate(fx_graph.nodes)}
    placeholders = [n for n in fx_graph.nodes if n.op == "placeholder"]
    emitted: dict[str, fx.Node] = {}
    for node in graph.nodes:
        if not is_computed(node) or node.name not in needed:
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
    return emitted
