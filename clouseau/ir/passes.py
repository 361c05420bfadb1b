"""Rewrite passes over the IR. Each takes a verified graph and returns a verified graph."""

from __future__ import annotations

from collections.abc import Sequence

from clouseau.ir.graph import INSTRUMENTATION, Graph, Node, NodeKind, Point, Ref
from clouseau.ir.selection import SelectLike, select_points

SAVE_PREFIX = "save."


def insert_saves(graph: Graph, select: SelectLike, *, strict: bool = True) -> Graph:
    """Insert one save node per selected value, right after the node that produces it.

    Several selected names that point at one value (a node and the module output it is)
    give one save node that lists every name, so the value is written once. The save node
    is called ``save.<first name>`` and keeps the names in execution order in ``names``.
    """
    return insert_saves_for(graph, select_points(graph, select, strict=strict))


def insert_saves_for(graph: Graph, points: Sequence[Point]) -> Graph:
    by_ref: dict[Ref, list[str]] = {}
    for point in points:
        by_ref.setdefault(point.ref, []).append(point.name)
    # An intervened value is saved as changed: after its intervene node, reading it.
    intervened = {n.inputs[0]: n for n in graph.nodes if n.kind is NodeKind.INTERVENE}
    nodes: list[Node] = []
    for node in graph.nodes:
        nodes.append(node)
        if node.kind is NodeKind.INTERVENE:
            names = by_ref.get(node.inputs[0])
            if names:
                nodes.append(save_node(Ref(node.name), tuple(names)))
            continue
        if node.kind in INSTRUMENTATION:
            continue
        for index in range(len(node.outputs)):
            ref = Ref(node.name, index)
            names = by_ref.get(ref)
            if names and ref not in intervened:
                nodes.append(save_node(ref, tuple(names)))
    return graph.with_nodes(_output_last(nodes))


def save_node(ref: Ref, names: tuple[str, ...]) -> Node:
    return Node(
        name=SAVE_PREFIX + names[0],
        kind=NodeKind.SAVE,
        op="save",
        inputs=(ref,),
        attrs=(("names", names),),
    )


def strip_saves(graph: Graph) -> Graph:
    """The graph without its save nodes (the inverse of :func:`insert_saves`)."""
    return graph.with_nodes(tuple(n for n in graph.nodes if n.kind is not NodeKind.SAVE))


def producer_of(graph: Graph, ref: Ref) -> Ref:
    """The value ``ref`` stands for: through intervene nodes, the original producer's output.

    Frontends name saved values and find them in the model's own graph with it.
    """
    node = graph.node(ref.node)
    while node.kind is NodeKind.INTERVENE:
        ref = node.inputs[0]
        node = graph.node(ref.node)
    return ref


def _output_last(nodes: list[Node]) -> tuple[Node, ...]:
    # A save of a value consumed only by the output lands after it; keep output last.
    outputs = [n for n in nodes if n.kind is NodeKind.OUTPUT]
    return tuple([n for n in nodes if n.kind is not NodeKind.OUTPUT] + outputs)
