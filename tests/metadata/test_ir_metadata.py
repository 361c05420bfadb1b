"""FLOPs rules, tables and the summary on hand-built graphs (no framework)."""

from __future__ import annotations

import io
import sys

import pytest

import clouseau
from clouseau.ir import Graph, MissingExtraError, ModuleInfo, Node, NodeKind, Ref, verify
from clouseau.ir.flops import OpCategory, category_attr, node_flops, total_flops
from clouseau.ir.interventions import rewrite
from clouseau.ir.metadata import node_metadata

from ..ir.graphs import block_graph, f32

MATMUL = category_attr(OpCategory.MATMUL)
ELEMENTWISE = category_attr(OpCategory.ELEMENTWISE)
REDUCTION = category_attr(OpCategory.REDUCTION)
FREE = category_attr(OpCategory.FREE)


def _graph(*nodes: Node, modules: tuple[ModuleInfo, ...] = ()) -> Graph:
    last = nodes[-1].name
    return verify(
        Graph(
            (*nodes, Node("output", NodeKind.OUTPUT, "output", (Ref(last),))), "G", modules=modules
        )
    )


def test_linear_and_matmul_count_two_flops_per_multiply_add():
    n, fin, fout = 3, 8, 16
    x = Node("x", NodeKind.INPUT, "input", outputs=(f32(n, fin),))
    fc = Node(
        "fc", NodeKind.OP, "linear", (Ref("x"),), (f32(n, fout),), "fc", "Linear", attrs=MATMUL
    )
    g = _graph(x, fc)
    assert node_flops(g, g.node("fc")) == 2 * fin * fout * n
    w = Node("w", NodeKind.CONSTANT, "parameter", outputs=(f32(fin, fout),))
    mm = Node("mm", NodeKind.OP, "matmul", (Ref("x"), Ref("w")), (f32(n, fout),), attrs=MATMUL)
    g = _graph(x, w, mm)
    assert node_flops(g, g.node("mm")) == 2 * fin * fout * n


def test_conv_from_module_attrs_and_from_the_weight_agree_with_the_textbook():
    n, cin, cout, groups, kh, kw, h, w = 2, 4, 6, 2, 3, 5, 7, 9
    textbook = 2 * cin // groups * kh * kw * cout * h * w * n
    x = Node("x", NodeKind.INPUT, "input", outputs=(f32(n, cin, h, w),))
    attrs = (
        ("in_channels", cin),
        ("out_channels", cout),
        ("kernel_size", (kh, kw)),
        ("groups", groups),
        *category_attr(OpCategory.CONV),
    )
    conv = Node("conv", NodeKind.OP, "conv2d", (Ref("x"),), (f32(n, cout, h, w),), attrs=attrs)
    g = _graph(x, conv)
    assert node_flops(g, g.node("conv")) == textbook
    weight = Node("weight", NodeKind.CONSTANT, "param", outputs=(f32(cout, cin // groups, kh, kw),))
    lax = Node(
        "conv",
        NodeKind.OP,
        "conv_general_dilated",
        (Ref("x"), Ref("weight")),
        (f32(n, cout, h, w),),
        attrs=category_attr(OpCategory.CONV),
    )
    g = _graph(x, weight, lax)
    assert node_flops(g, g.node("conv")) == textbook


def test_elementwise_reductions_free_ops_and_unknown_ops():
    x = Node("x", NodeKind.INPUT, "input", outputs=(f32(2, 8),))
    relu = Node("relu", NodeKind.OP, "relu", (Ref("x"),), (f32(2, 8),), attrs=ELEMENTWISE)
    total = Node("sum", NodeKind.OP, "sum", (Ref("relu"),), (f32(2),), attrs=REDUCTION)
    view = Node("view", NodeKind.OP, "view", (Ref("sum"),), (f32(1, 2),), attrs=FREE)
    odd = Node("odd", NodeKind.OP, "my_custom_op", (Ref("view"),), (f32(1, 2),))
    g = _graph(x, relu, total, view, odd)
    assert [node_flops(g, n) for n in g.nodes[1:5]] == [16, 16, 0, None]
    assert total_flops(g) == 32


def test_scan_bodies_count_once_per_iteration():
    x = Node("x", NodeKind.INPUT, "input", outputs=(f32(4),), key="in0")
    carry = Node(
        "scan.carry", NodeKind.OP, "scan_carry", (Ref("x"),), (f32(4),), attrs=FREE, key="0/in0"
    )
    tanh = Node(
        "scan.tanh",
        NodeKind.OP,
        "tanh",
        (Ref("scan.carry"),),
        (f32(4),),
        attrs=ELEMENTWISE,
        key="0/0",
    )
    scan = Node(
        "scan",
        NodeKind.OP,
        "scan",
        (Ref("x"),),
        (f32(4),),
        attrs=(("length", 5), *category_attr(OpCategory.LOOP)),
        key="0",
    )
    g = _graph(x, carry, tanh, scan)
    assert total_flops(g) == 5 * 4


def test_metadata_of_a_node_has_module_params_and_source():
    g = block_graph()
    meta = node_metadata(g, g.node("conv1"))
    assert meta.module_params == 148
    assert meta.shapes == ((2, 4, 8, 8),)
    assert meta.dtypes == ("float32",)
    assert meta.source == "/home/user/model.py:12"


def test_to_pandas_has_one_row_per_point_and_marks_instrumentation():
    pytest.importorskip("pandas")
    g = rewrite(
        block_graph(), select="fc", intervene={"layer1.0.relu": clouseau.zero()}, grads=True
    ).graph
    frame = g.to_pandas()
    assert tuple(frame["name"]) == g.names()
    row = frame.set_index("name").loc["layer1.0.relu"]
    assert row["intervention"] == "zero()"
    assert row["module_params"] == 0 and row["module_type"] == "ReLU"
    fc = frame.set_index("name").loc["fc"]
    assert bool(fc["saved"]) and bool(fc["grad_saved"])
    # linear: in_features is the input's last axis (8); out is f32[2,10]
    assert fc["flops"] == 2 * 8 * 2 * 10


def test_to_pandas_without_pandas_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(MissingExtraError, match=r"clouseau\[pandas\]"):
        block_graph().to_pandas()


def test_summary_prints_the_module_tree_with_params_and_flops():
    g = rewrite(block_graph(), select=None, intervene={"layer1.0.relu": clouseau.zero()}).graph
    out = io.StringIO()
    g.summary(file=out)
    text = out.getvalue()
    for expected in ("layer1", "BasicBlock", "f32[2,4,8,8]", "148", "zero()", "total", "1,000"):
        assert expected in text, expected
