"""Where computed points go in a lowered graph, and the interventions on them.

An intervention on a computed point that stands in for a model value
(:mod:`clouseau.ir.computed_interventions`: a fused kernel's ``pattern`` or ``scores``,
``attn.head_out``) recomputes that value from the intervened point (the kernel's
decomposition, the sum over heads plus the bias), so the intervened value is what the
model reads; one on the logit lens, which nothing reads, changes its saved value only.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch.fx as fx

from clouseau.capture.torch.lowering.computed import (
    COMPUTED_META,
    lower_computed,
    replayed,
    softmax_node,
)
from clouseau.capture.torch.lowering.computed_heads import heads_projected, heads_recomposed
from clouseau.capture.torch.lowering.intervene import grad_through
from clouseau.ir.computed import is_computed
from clouseau.ir.computed_interventions import StandIn
from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import INSTRUMENTATION, AttrValue, Graph
from clouseau.ir.passes import producer_of


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
        # An intervened input is read where it is produced: the intervention, lowered
        # next right after it, rewires every later reader (these nodes too) to its value.
        inputs = [values[producer_of(graph, r).node] for r in node.inputs]
        # After its inputs and every node it replays (a replay reads what they read).
        reads = inputs + [fx_nodes[keys[name]] for name in replayed(node)]
        anchor = max(reads, key=order.__getitem__)
        if anchor.op == "placeholder":
            anchor = placeholders[-1]
        with fx_graph.inserting_before(anchor.next):
            fast = heads_projected(graph, fx_graph, node, inputs[0], fx_nodes)
            if fast is not None:  # head_out: one batched matmul, not a projection per head
                fast.meta[COMPUTED_META] = True
            emitted[node.name] = fast or lower_computed(fx_graph, node, inputs, fx_nodes, keys)
        values[node.name] = emitted[node.name]
        if what == "scores":
            scores[kernel] = emitted[node.name]
    return emitted


def lower_stand_ins(
    graph: Graph,
    found: tuple[StandIn, ...],
    fx_graph: fx.Graph,
    values: dict[str, fx.Node],
    fx_nodes: Mapping[str, fx.Node],
) -> list[fx.Node]:
    """Make the model read each intervened computed point that stands in for a model value
    (``found``: :func:`clouseau.ir.computed_interventions.stand_ins`): the value recomputed from it,
    for every reader after it (``values``: the fx node of each IR value, the intervened
    ones too; updated). Returns the fx nodes it may drop once the graph is complete."""
    keys = {n.name: n.key for n in graph.nodes if n.key}
    drops: list[fx.Node] = []
    for stand_in in found:
        if stand_in.replaces is None or stand_in.program is None:
            continue  # a view nothing reads: the intervene node changes the saved value
        program, replaced = stand_in.program, values[stand_in.replaces]
        inputs = [values[r.node] for r in program.inputs]
        order = {n: i for i, n in enumerate(fx_graph.nodes)}
        anchor = max([*inputs, replaced], key=order.__getitem__)
        with fx_graph.inserting_before(anchor.next):
            point = graph.node(stand_in.point)
            out = heads_recomposed(graph, fx_graph, point, inputs[0], fx_nodes)
            out = out or lower_computed(fx_graph, program, inputs, fx_nodes, keys)
            if stand_in.gradient:  # the model's value forward, the program's backward
                out = fx_graph.call_function(grad_through, (replaced, out))
        after = False
        later: set[fx.Node] = set()
        for n in fx_graph.nodes:
            if after:
                later.add(n)
            after = after or n is out
        # Later readers only: the point's own computation reads the model's value.
        _check_read_later(stand_in, replaced, values[stand_in.intervene], later | {out})
        replaced.replace_all_uses_with(out, delete_user_cb=later.__contains__)
        drops += [
            values[name]
            for name in reversed(stand_in.drops)
            if name in values and name != stand_in.replaces
        ]
        values[stand_in.replaces] = out
        if not replaced.users:  # the kernel (an RNG op to fx, though its dropout is 0)
            fx_graph.erase_node(replaced)
    return drops


def _check_read_later(
    stand_in: StandIn, replaced: fx.Node, changed: fx.Node, later: set[fx.Node]
) -> None:
    """Refuse a reader of ``replaced`` placed before the value recomputed for it that is
    not part of computing the intervened point: it would read the unchanged value."""
    own: set[fx.Node] = set()
    todo = [changed]
    while todo:
        node = todo.pop()
        if node not in own:
            own.add(node)
            todo += node.all_input_nodes
    early = [u.name for u in replaced.users if u not in later and u not in own]
    if early:
        raise SelectionError(
            f"cannot intervene on {stand_in.point!r}: {', '.join(early)} read(s) the value "
            f"it stands in for ({stand_in.replaces!r}) before clouseau can recompute it. "
            "Intervene on the value it is computed from, or select fewer computed points."
        )


def drop_unread(fx_graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """Erase ``nodes`` (in order) that nothing reads and that have no side effect."""
    for node in nodes:
        if node.graph is fx_graph and not node.users and not node.is_impure():
            fx_graph.erase_node(node)
