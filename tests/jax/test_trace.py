"""Tracing: names, selection, graph metadata and errors of the JAX frontend."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clouseau.capture import jax as cj
from clouseau.ir.errors import SelectionError, TraceError
from clouseau.ir.graph import DType, NodeKind, TensorSpec, TraceKind
from clouseau.ir.passes import insert_saves
from clouseau.ir.verify import verify
from tests.jax.models import CNN, MLP, Block, scan_mlp, scan_params

KEY = jax.random.PRNGKey(0)


def _selected(graph: Any, select: Any) -> set[str]:
    saved = insert_saves(graph, select)
    return {name for node in saved.saves for name in node.attr("names")}


def test_mlp_names_modules_and_specs() -> None:
    model = MLP((4, 8, 8, 3), key=KEY)
    graph = cj.trace(model, jnp.zeros(4))
    verify(graph)
    assert graph.trace_kind is TraceKind.JAX
    names = graph.names()
    for name in (
        "x",
        "layers.0",
        "relu",
        "layers.1.dot_general",
        "layers.1.add",
        "layers.1",
        "relu_1",
        "layers.2",
    ):
        assert name in names
    assert [(m.path, m.type, m.params) for m in graph.modules] == [
        ("", "MLP", 4 * 8 + 8 + 8 * 8 + 8 + 8 * 3 + 3),
        ("layers.0", "Linear", 4 * 8 + 8),
        ("layers.1", "Linear", 8 * 8 + 8),
        ("layers.2", "Linear", 8 * 3 + 3),
    ]
    point = graph.point("layers.1")
    assert point.spec == TensorSpec((8,), DType.FLOAT32)
    assert (point.module, point.module_type) == ("layers.1", "Linear")
    assert graph.point("relu").op == "relu"
    assert graph.node("layers.0.weight").kind is NodeKind.CONSTANT
    assert graph.node("x").kind is NodeKind.INPUT


def test_activations_are_named_even_where_jax_inlines_them() -> None:
    block = cj.trace(Block(key=KEY), jnp.zeros((5, 8)))
    assert block.point("gelu").op == "gelu"
    assert block.point("attn.softmax").op == "softmax"
    assert block.point("attn.softmax").module == "attn"

    def acts(x: jax.Array) -> jax.Array:
        return (
            jax.nn.sigmoid(x) + jax.nn.tanh(x) + jax.nn.silu(x) + jax.nn.softmax(x) + jax.nn.gelu(x)
        )

    graph = cj.trace(acts, jnp.zeros(3))
    assert {p.op for p in graph.points} >= {"sigmoid", "tanh", "silu", "softmax", "gelu"}


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        ("relu*", {"relu", "relu_1"}),
        # parameters (layers.1.weight, layers.1.bias) are state, not points
        ("layers.1.*", {"layers.1.dot_general", "layers.1.add"}),
        ("layers.?", {"layers.0", "layers.1", "layers.2"}),
    ],
)
def test_select_mlp(select: str, expected: set[str]) -> None:
    graph = cj.trace(MLP((4, 8, 8, 3), key=KEY), jnp.zeros(4))
    assert _selected(graph, select) == expected


def test_select_transformer_block() -> None:
    graph = cj.trace(Block(key=KEY), jnp.zeros((5, 8)))
    assert _selected(graph, "gelu*") == {"gelu"}
    assert _selected(graph, "softmax*") == {"attn.softmax"}
    assert _selected(graph, "attn") == {"attn"}
    assert _selected(graph, "attn.s*") == {
        "attn.softmax",
        "attn.split:0",
        "attn.split:1",
        "attn.split:2",
    }  # attn.sqrt (of the head size) depends on no input: not a point


def test_cnn_names() -> None:
    graph = cj.trace(CNN(key=KEY), jnp.zeros((3, 6, 6)))
    assert {"conv", "conv.conv_general_dilated", "norm", "relu", "head"} <= set(graph.names())
    assert graph.point("conv").spec.shape == (4, 6, 6)


def test_scan_points_and_named_scope() -> None:
    graph = cj.trace(scan_mlp, scan_params(KEY), jnp.zeros(6))
    assert {"params.w", "x", "scan.carry", "scan.x", "scan.add", "scan.tanh", "scan"} <= set(
        graph.names()
    )
    assert graph.point("scan.tanh").spec.shape == (6,)  # one iteration's value

    def scoped(x: jax.Array) -> jax.Array:
        with jax.named_scope("encoder"):
            y = jnp.sin(x)
        return jax.jit(lambda z: z * 2)(y)

    names = cj.trace(scoped, jnp.zeros(3)).names()
    assert "encoder.sin" in names
    assert "lambda.mul" in names and "lambda" in names


def test_source_points_at_the_users_line() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jnp.sin(x) * 3  # the line the mul node should name

    graph = cj.trace(f, jnp.zeros(3))
    source = graph.node("mul").source
    assert source is not None and source.file == __file__
    with open(__file__) as handle:
        assert "the line the mul node" in handle.read().splitlines()[source.line - 1]
    block = cj.trace(Block(key=KEY), jnp.zeros((5, 8)))
    add = block.node("add").source
    assert add is not None and add.file.endswith("tests/jax/models.py")


def test_while_body_points_are_selectable() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2), (0, x))[1]

    graph = cj.trace(f, jnp.ones(3))
    assert {"while:1", "while.mul", "while.carry_1"} <= set(graph.names())
    with pytest.raises(SelectionError, match="closest"):
        insert_saves(graph, "while.mull")


def test_python_control_flow_on_values_is_a_trace_error() -> None:
    def branchy(x: jax.Array) -> jax.Array:
        if x.sum() > 0:  # value-dependent Python branch
            return x
        return -x

    with pytest.raises(TraceError, match=r"test_trace\.py:\d+ \(branchy\).*lax\.cond.*jnp\.where"):
        cj.trace(branchy, jnp.ones(3))


def test_bad_models_are_type_errors() -> None:
    with pytest.raises(TypeError, match="cannot trace a int"):
        cj.trace(3, jnp.ones(3))
    with pytest.raises(TypeError, match="no array"):
        cj.trace(lambda: 1.0)
    with pytest.raises(TypeError, match="no array"):
        cj.trace(eqx.nn.Lambda(jax.nn.relu), 1.0)
    with pytest.raises(TypeError, match="cannot trace"):
        cj.instrument("model", select="*", sink=None)  # type: ignore[arg-type]


def test_selection_matching_nothing_raises_on_first_call(sink: Any) -> None:
    fm = cj.instrument(MLP((4, 8, 3), key=KEY), select="gelu*", sink=sink)
    with pytest.raises(SelectionError, match="gelu"):
        fm(jnp.zeros(4))


def test_instrumented_module_is_a_pytree_of_the_models_arrays(sink: Any) -> None:
    model = MLP((4, 8, 3), key=KEY)
    fm = cj.instrument(model, select="relu", sink=sink)
    assert isinstance(fm, eqx.Module)
    leaves = jax.tree_util.tree_leaves(fm)
    assert len(leaves) == len(jax.tree_util.tree_leaves(model))
    assert all(a is b for a, b in zip(leaves, jax.tree_util.tree_leaves(model), strict=True))
    with fm:
        np.testing.assert_allclose(fm(jnp.ones(4)), model(jnp.ones(4)), rtol=1e-6)
    assert sink.closed
