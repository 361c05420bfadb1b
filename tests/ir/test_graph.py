"""The IR itself: points, printer (golden), JSON round-trip, verifier, save pass."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clouseau.ir import Graph, NodeKind, Ref, VerificationError, insert_saves, strip_saves, verify
from clouseau.ir.graph import Node, TraceKind
from tests.conftest import GOLDEN, check_golden

from .graphs import block_graph


def test_points_follow_execution_order_and_skip_non_tensors():
    g = verify(block_graph())
    assert g.names() == (
        "x", "conv1", "layer1.0.conv1", "layer1.0.bn1", "layer1.0.relu", "layer1.0.add",
        "layer1.0.relu_1", "layer1.0", "layer1", "fc",
    )  # fmt: skip
    assert g.point("layer1.0").ref == Ref("layer1.0.relu_1")
    assert g.point("layer1.0").is_alias


def test_printer_golden():
    g = insert_saves(block_graph(), "relu*")
    check_golden(GOLDEN / "block_graph.txt", str(verify(g)) + "\n")


def test_json_round_trip_preserves_the_graph():
    g = verify(insert_saves(block_graph(), ["layer1.*", "fc"]))
    data = json.loads(json.dumps(g.to_json()))
    assert Graph.from_json(data) == g


def test_insert_saves_writes_a_value_once_for_all_its_names():
    g = verify(insert_saves(block_graph(), ["layer1", "layer1.*"]))
    saves = {s.inputs[0].node: s.attr("names") for s in g.saves}
    assert saves["layer1.0.relu_1"] == ("layer1.0.relu_1", "layer1.0", "layer1")
    assert len(g.saves) == 5
    # each save sits right after its producer
    order = [n.name for n in g.nodes]
    assert order.index("save.layer1.0.relu_1") == order.index("layer1.0.relu_1") + 1
    assert strip_saves(g) == block_graph()


def test_insert_saves_with_nothing_selected_is_the_identity():
    assert insert_saves(block_graph(), None) == block_graph()
    assert insert_saves(block_graph(), []) == block_graph()


def _output_of(name: str) -> Node:
    return Node("output", NodeKind.OUTPUT, "output", (Ref(name),))


def _break(graph: Graph, index: int, **changes: object) -> Graph:
    nodes = list(graph.nodes)
    nodes[index] = replace(nodes[index], **changes)
    return graph.with_nodes(tuple(nodes))


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (
            lambda g: _break(g, 3, inputs=(Ref("nowhere"),)),
            r"layer1\.0\.bn1.*reads %nowhere, which is not defined",
        ),
        (lambda g: _break(g, 3, inputs=(Ref("fc"),)), r"reads %fc, which is not defined before it"),
        (lambda g: _break(g, 3, inputs=(Ref("conv1", 2),)), r"'conv1' has 1 output"),
        (lambda g: _break(g, 4, name="layer1.0.bn1"), r"used by two nodes"),
        (lambda g: _break(g, 2, aliases=((0, "fc"),)), r"point name 'fc' is used twice"),
        (lambda g: _break(g, 2, name="bad name"), r"not a valid name"),
        (lambda g: g.with_nodes(g.nodes[:-1]), r"must end with an output node"),
        (
            lambda g: g.with_nodes((*g.nodes[:-2], _output_of("layer1.0.relu_1"), g.nodes[-2])),
            r"output node must be the last",
        ),
    ],
)
def test_verifier_rejects_a_corrupted_graph_naming_the_node(corrupt, message):
    with pytest.raises(VerificationError, match=message):
        verify(corrupt(block_graph()))


def test_verifier_rejects_a_save_of_a_non_tensor():
    g = block_graph()
    bad_save = Node(
        "save.size", NodeKind.SAVE, "save", (Ref("layer1.0.size"),), attrs=(("names", ("s",)),)
    )
    nodes = (*g.nodes[:8], bad_save, *g.nodes[8:])
    with pytest.raises(VerificationError, match=r"node #8 \(save %layer1\.0\.size.*not a tensor"):
        verify(g.with_nodes(nodes))


def test_verifier_checks_subgraphs():
    inner = _break(block_graph(), 3, inputs=(Ref("nowhere"),))
    outer = _break(block_graph(), 2, subgraphs=(inner,))
    with pytest.raises(VerificationError, match=r"in its subgraph.*nowhere"):
        verify(outer)


def test_graph_node_lookup_names_close_matches():
    with pytest.raises(KeyError, match=r"layer1\.0\.relu"):
        block_graph().node("layer1.0.rleu")


@pytest.mark.parametrize("kind", list(TraceKind))
def test_graph_files_store_how_the_graph_was_traced_under_the_same_key(kind: TraceKind):
    g = replace(block_graph(), trace_kind=kind)
    data = json.loads(json.dumps(g.to_json()))
    # Files written before TraceKind had its name keep loading: same key, same strings.
    assert data["frontend"] == kind.value
    assert Graph.from_json(data).trace_kind is kind
    assert g.frontend is kind  # the old attribute name still answers


def test_node_names_are_the_names_of_a_save():
    g = insert_saves(block_graph(), ["layer1.0.relu_1", "layer1.0", "fc"])
    by_names = {save.names for save in g.saves}
    assert by_names == {("layer1.0.relu_1", "layer1.0"), ("fc",)}
    assert all(save.names == save.attr("names") for save in g.saves)
    assert g.node("fc").names == ()
