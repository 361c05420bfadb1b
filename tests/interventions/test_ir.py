"""The intervention and gradient passes on hand-built graphs (no framework)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import clouseau
from clouseau.ir import Graph, NodeKind, Ref, SelectionError, VerificationError, verify
from clouseau.ir.actions import ActionKind
from clouseau.ir.interventions import insert_interventions, rewrite
from clouseau.ir.passes import insert_saves, producer_of

from ..ir.graphs import block_graph


class NumpyOps:
    """The ArrayOps of the frontends, in numpy, to check actions without a framework."""

    def zeros_like(self, value):
        return np.zeros_like(value)

    def clip(self, value, lo, hi):
        return np.clip(value, lo, hi)

    def batch_mean(self, value):
        return np.broadcast_to(value.mean(axis=0, keepdims=True), value.shape)

    def normal(self, value, seed):
        return np.random.default_rng(seed).standard_normal(value.shape).astype(value.dtype)

    def constant(self, array, like):
        return np.broadcast_to(np.asarray(array, dtype=like.dtype), like.shape)


def test_intervene_node_follows_its_producer_and_every_later_consumer_reads_it():
    out = rewrite(
        block_graph(), select="layer1.0.relu", intervene={"layer1.0.relu": clouseau.zero()}
    )
    g = out.graph
    order = [n.name for n in g.nodes]
    at = order.index("layer1.0.relu")
    assert order[at + 1] == "intervene.layer1.0.relu"
    assert order[at + 2] == "save.layer1.0.relu"  # the save reads the changed value
    assert g.node("save.layer1.0.relu").inputs == (Ref("intervene.layer1.0.relu"),)
    assert g.node("layer1.0.add").inputs == (Ref("intervene.layer1.0.relu"), Ref("conv1"))
    assert producer_of(g, Ref("intervene.layer1.0.relu")) == Ref("layer1.0.relu")
    assert out.actions["intervene.layer1.0.relu"].kind is ActionKind.ZERO
    # Points (what users select and read) are unchanged by the pass.
    assert g.names() == block_graph().names()


def test_saves_then_interventions_gives_the_same_graph_as_the_other_order():
    intervene = {"relu*": clouseau.scale(2.0)}
    first = insert_interventions(insert_saves(block_graph(), "relu*"), intervene).graph
    second = rewrite(block_graph(), select="relu*", intervene=intervene).graph
    assert first == second


def test_module_alias_and_node_name_share_one_intervene_node_and_the_output_is_rewired():
    g = rewrite(
        block_graph(), select=None, intervene={("layer1", "layer1.0.relu_1"): clouseau.zero()}
    ).graph
    (node,) = g.interventions
    assert node.attr("names") == ("layer1.0.relu_1", "layer1.0", "layer1")
    assert g.node("fc").inputs == (Ref(node.name),)
    assert g.node("layer1.0.size").inputs == (Ref(node.name),)


def test_printer_shows_the_action_and_json_round_trips():
    g = rewrite(
        block_graph(),
        select="relu*",
        intervene={"layer1.0.relu": clouseau.clamp(0.0, 1.0)},
        grads=True,
    ).graph
    text = str(g)
    assert (
        "%intervene.layer1.0.relu : f32[2,4,8,8] = intervene[clamp(lo=0.0, hi=1.0)](%layer1.0.relu)"
        in text
    )
    assert "save_grad %intervene.layer1.0.relu as layer1.0.relu.grad" in text
    assert "save_grad %layer1.0.relu_1 as layer1.0.relu_1.grad" in text
    assert Graph.from_json(json.loads(json.dumps(g.to_json()))) == g


def test_nothing_selected_leaves_the_graph_as_the_save_pass_makes_it():
    plain = insert_saves(block_graph(), "relu*")
    assert rewrite(block_graph(), select="relu*").graph == plain
    assert rewrite(block_graph(), select="relu*", intervene={}, grads=False).graph == plain
    assert rewrite(block_graph(), select=None).graph == block_graph()


def test_bad_intervene_patterns_are_reported():
    with pytest.raises(SelectionError, match="no point"):
        rewrite(block_graph(), select=None, intervene={"nosuch*": clouseau.zero()})
    with pytest.raises(SelectionError, match="two intervene patterns"):
        rewrite(
            block_graph(),
            select=None,
            intervene={"relu*": clouseau.zero(), "layer1.0.relu": clouseau.scale(2)},
        )
    with pytest.raises(TypeError, match="action"):
        clouseau.ir.interventions.check_intervene({"relu*": 0.0})


def test_grads_pattern_selects_its_own_points():
    g = rewrite(block_graph(), select="fc", grads="layer1.0.relu_1").graph
    (node,) = g.grad_saves
    assert node.attr("names") == ("layer1.0.relu_1.grad",)
    assert [s.attr("names") for s in g.saves] == [("fc",)]


def test_verifier_rejects_an_intervene_node_that_changes_the_spec():
    g = rewrite(block_graph(), select=None, intervene={"fc": clouseau.zero()}).graph
    node = g.node("intervene.fc")
    bad = g.with_nodes(
        tuple(replace(n, outputs=g.node("conv1").outputs) if n is node else n for n in g.nodes)
    )
    with pytest.raises(VerificationError, match="spec"):
        verify(bad)
    assert node.kind is NodeKind.INTERVENE


def test_actions_compute_what_they_say():
    ops = NumpyOps()
    x = np.arange(-6.0, 6.0, dtype=np.float32).reshape(3, 4)
    spec = block_graph().node("fc").outputs[0]
    np.testing.assert_array_equal(clouseau.zero().apply(x, ops), np.zeros_like(x))
    np.testing.assert_array_equal(clouseau.scale(0.5).apply(x, ops), x * 0.5)
    np.testing.assert_array_equal(clouseau.add(1.5).apply(x, ops), x + 1.5)
    np.testing.assert_array_equal(clouseau.add(np.ones(4)).apply(x, ops), x + 1)
    np.testing.assert_array_equal(clouseau.clamp(-1, 2).apply(x, ops), np.clip(x, -1, 2))
    np.testing.assert_array_equal(clouseau.clamp(hi=0).apply(x, ops), np.minimum(x, 0))
    np.testing.assert_array_equal(
        clouseau.mean_ablate().apply(x, ops), np.broadcast_to(x.mean(0), x.shape)
    )
    np.testing.assert_array_equal(clouseau.replace(np.tanh).apply(x, ops), np.tanh(x))
    noisy = clouseau.noise(0.1, seed=3)
    np.testing.assert_array_equal(noisy.apply(x, ops), noisy.apply(x, ops))
    assert np.abs(noisy.apply(x, ops) - x).max() > 0
    with pytest.raises(ValueError, match="shape"):
        clouseau.replace(lambda v: v[0]).apply(x, ops)
    # patch and mean_ablate over a capture read the capture when bound to a point.
    other = np.full((2, 10), 7.0, dtype=np.float32)
    patched = clouseau.patch({"fc": other}).bind(("fc",), spec)
    np.testing.assert_array_equal(patched.apply(np.zeros((2, 10), np.float32), ops), other)
    renamed = clouseau.patch({"head": other}, name="head").bind(("fc",), spec)
    np.testing.assert_array_equal(renamed.apply(np.zeros((2, 10), np.float32), ops), other)
    cap = {"fc": np.arange(20, dtype=np.float32).reshape(2, 10)}
    mean = clouseau.mean_ablate(cap).bind(("fc",), spec).apply(np.zeros((2, 10), np.float32), ops)
    np.testing.assert_allclose(mean, np.broadcast_to(cap["fc"].mean(0), (2, 10)))
    with pytest.raises(SelectionError, match="broadcast"):
        clouseau.patch({"fc": np.zeros((3, 10))}).bind(("fc",), spec)
    with pytest.raises(SelectionError, match="holds none"):
        clouseau.patch({"other": other}).bind(("fc",), spec)


def test_descriptions_are_printable():
    assert clouseau.zero().describe() == "zero()"
    assert clouseau.scale(2).describe() == "scale(2.0)"
    assert clouseau.add(np.zeros(3, np.float32)).describe() == "add(<array float32[3]>)"
    assert clouseau.noise(0.1).describe() == "noise(std=0.1, seed=0)"
    assert clouseau.replace(np.tanh).describe() == "replace(tanh)"
    assert clouseau.patch({}, name="fc").describe() == "patch(capture, name='fc')"
    assert clouseau.mean_ablate().describe() == "mean_ablate(batch_axis=0)"


def test_overlapping_patterns_with_equal_actions_are_one_intervention():
    intervene = {"relu*": clouseau.zero(), "layer1.0.relu": clouseau.zero()}
    g = rewrite(block_graph(), select=None, intervene=intervene).graph
    assert [n.name for n in g.interventions] == [
        "intervene.layer1.0.relu",
        "intervene.layer1.0.relu_1",
    ]


def test_patch_from_a_capture_of_several_calls_needs_a_call(tmp_path: Path) -> None:
    # cap[name] stacks several calls on a new first axis; a patch must not take that stack.
    from clouseau.ir.graph import DType, TensorSpec
    from tests.cli.test_diff import write_capture

    cap = clouseau.load(write_capture(tmp_path / "c", [{"fc": np.zeros(3)}, {"fc": np.ones(3)}]))
    spec = TensorSpec((3,), DType.FLOAT64)
    with pytest.raises(SelectionError, match=r"from 2 calls \[0, 1\]; pick one with patch"):
        clouseau.patch(cap).bind(("fc",), spec)
    one = clouseau.patch(cap, call=1).bind(("fc",), spec)
    np.testing.assert_array_equal(one.apply(np.zeros(3), NumpyOps()), np.ones(3))
