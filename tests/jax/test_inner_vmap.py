"""Submodules that the model itself calls under ``jax.vmap`` are saved batch axis first.

Equinox layers vmap their submodules themselves (``MultiheadAttention`` runs
``jax.vmap(self.query_proj)(query)``). JAX's batching rule may leave the batch axis of such
an output anywhere (last, for a ``Linear`` without bias); a saved output must equal what an
eager ``jax.vmap`` of that submodule returns, called directly, under ``eqx.filter_jit``,
under an outer ``jax.vmap`` (outer batch axis first) and under ``grad``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import clouseau
from clouseau.capture.jax.jaxpr_trace import trace_jaxpr
from tests.jax.models import numpy_init as filled

RTOL, ATOL = 1e-5, 1e-5
KEY = jax.random.PRNGKey(0)
PROJECTIONS = ("query_proj", "key_proj", "value_proj", "output_proj")


def primitives(jaxpr: Any) -> set[str]:
    """Every primitive of ``jaxpr`` and of the jaxprs nested in its equations."""
    found: set[str] = set()
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    found |= primitives(getattr(item, "jaxpr", item))
    return found


def batch(x: jax.Array) -> jax.Array:
    return jnp.stack([x, 0.5 * x + 0.25, -x])


def run(context: str, fm: Any, *args: jax.Array) -> Any:
    """Call the instrumented model in ``context`` (under vmap: on a batch of each argument)."""
    if context == "direct":
        return fm(*args)
    if context == "filter_jit":
        return eqx.filter_jit(lambda m, *a: m(*a))(fm, *args)
    assert context == "vmap"
    return jax.vmap(lambda *a: fm(*a))(*map(batch, args))


def expected(context: str, reference: Callable[..., Any], *args: jax.Array) -> Any:
    """``reference(*args)`` as ``run`` sees it: under vmap, of the batch, batch axis first."""
    if context == "vmap":
        return jax.jit(jax.vmap(reference))(*map(batch, args))
    return jax.jit(reference)(*args)


def assert_close(got: Any, want: Any, name: str) -> None:
    assert np.shape(got) == np.shape(want), name
    np.testing.assert_allclose(
        np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL, err_msg=name
    )


def assert_same_leaves(got: Any, want: Any) -> None:
    got_leaves = jax.tree_util.tree_leaves(eqx.filter(got, eqx.is_array))
    want_leaves = jax.tree_util.tree_leaves(eqx.filter(want, eqx.is_array))
    assert len(got_leaves) == len(want_leaves)
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        assert_close(g, w, f"leaf {i}")


# --- eqx.nn.MultiheadAttention ---------------------------------------------------------------


def attention() -> tuple[Any, jax.Array, jax.Array, jax.Array]:
    """An attention layer and (seq, dim) inputs with seq != dim: a transpose fails by shape."""
    mha = filled(eqx.nn.MultiheadAttention, num_heads=2, query_size=4, key=KEY)
    q = jnp.linspace(-1, 1, 12).reshape(3, 4)
    k = jnp.linspace(1, -2, 20).reshape(5, 4)
    v = jnp.cos(jnp.arange(20.0)).reshape(5, 4)
    return mha, q, k, v


def projections(mha: Any, q: jax.Array, k: jax.Array, v: jax.Array) -> dict[str, jax.Array]:
    """Each projection as an eager ``jax.vmap`` of it returns it (the output's is the model's)."""
    return {
        "query_proj": jax.vmap(mha.query_proj)(q),
        "key_proj": jax.vmap(mha.key_proj)(k),
        "value_proj": jax.vmap(mha.value_proj)(v),
        "output_proj": mha(q, k, v),
    }


def test_attention_points_are_the_projections() -> None:
    mha, q, k, v = attention()
    names = clouseau.trace(mha, q, k, v).names()
    assert set(PROJECTIONS) <= set(names)


@pytest.mark.parametrize("context", ["direct", "filter_jit", "vmap"])
def test_attention_projections_equal_eager_vmap(tmp_path: Path, context: str) -> None:
    mha, q, k, v = attention()
    with clouseau.instrument(mha, select="*_proj", path=tmp_path) as fm:
        out = run(context, fm, q, k, v)
    cap = clouseau.load(tmp_path)
    assert sorted(cap.names()) == sorted(PROJECTIONS)
    want = expected(context, functools.partial(projections, mha), q, k, v)
    for name in PROJECTIONS:
        assert_close(cap[name], want[name], name)
    if context == "vmap":
        assert np.shape(cap["key_proj"]) == (3, 5, 4)  # outer batch, then the model's own
    assert_close(out, expected(context, lambda *a: mha(*a), q, k, v), "output")


def test_attention_under_grad(tmp_path: Path) -> None:
    mha, q, k, v = attention()

    def loss(model: Any, q: jax.Array) -> jax.Array:
        return jnp.sum(model(q, k, v) ** 2)

    with clouseau.instrument(mha, select="*_proj", path=tmp_path) as fm:
        grads = eqx.filter_grad(loss)(fm, q)
        grad_q = jax.grad(lambda q: loss(fm, q))(q)
    assert_same_leaves(grads.model, eqx.filter_jit(eqx.filter_grad(loss))(mha, q))
    assert_close(grad_q, jax.jit(jax.grad(lambda q: loss(mha, q)))(q), "d loss / d q")
    cap = clouseau.load(tmp_path)
    want = projections(mha, q, k, v)
    for call in range(2):  # the primal values, once per grad
        for name in PROJECTIONS:
            assert_close(cap.get(name, call=call), want[name], name)


def test_attention_jaxpr_has_no_custom_vmap() -> None:
    # The pins are batched away; where nothing is vmapped none is added (custom_vmap
    # has no reverse-mode rule).
    mha, q, k, v = attention()
    pinned = trace_jaxpr(mha, (q, k, v), {}).jaxpr.jaxpr
    assert "transpose" in primitives(pinned)
    assert not {p for p in primitives(pinned) if "custom_vmap" in p}
    plain = trace_jaxpr(mha.query_proj, (q[0],), {}).jaxpr.jaxpr
    assert not {p for p in primitives(plain) if "custom_vmap" in p}


# --- a module that vmaps an MLP over its rows --------------------------------------------------


class RowMLP(eqx.Module):
    """An MLP applied to each row by the module's own ``jax.vmap``, then a running sum.

    No bias: ``weight @ x`` batched puts the batch axis last, and the running sum along
    the rows would be wrong if the vmap's result were not in the layout JAX gave it.
    """

    mlp: eqx.nn.MLP

    def __init__(self, width_in: int, width_out: int, hidden: int, depth: int) -> None:
        self.mlp = eqx.nn.MLP(
            width_in, width_out, hidden, depth, use_bias=False, use_final_bias=False, key=KEY
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.cumsum(jax.vmap(self.mlp)(x), axis=0)


def row_points(model: RowMLP, x: jax.Array) -> dict[str, jax.Array]:
    """Every module and activation of the MLP as an eager ``jax.vmap`` of it returns it."""
    out: dict[str, jax.Array] = {}
    h = x
    for i, layer in enumerate(model.mlp.layers):
        h = out[f"mlp.layers.{i}"] = jax.vmap(layer)(h)
        if i < len(model.mlp.layers) - 1:
            h = out["mlp.relu" + (f"_{i}" if i else "")] = jax.vmap(jax.nn.relu)(h)
    out["mlp"] = h
    return out


ROW_MODELS = {
    # seq 5 rows; every point (5, 6) or (5, 3): a transposed save fails by shape
    "non-square": ((4, 3, 6, 2), (5, 4)),
    # seq 5 rows of width 5: only the values tell a transposed save
    "square": ((4, 5, 5, 1), (5, 4)),
}


@pytest.mark.parametrize("context", ["direct", "filter_jit", "vmap"])
@pytest.mark.parametrize("shape", ROW_MODELS)
def test_row_mlp_points_equal_eager_vmap(tmp_path: Path, shape: str, context: str) -> None:
    widths, x_shape = ROW_MODELS[shape]
    model = filled(RowMLP, *widths)
    x = jnp.sin(jnp.arange(float(np.prod(x_shape)))).reshape(x_shape)
    with clouseau.instrument(
        model, select=["mlp", "mlp.layers.?", "mlp.relu*"], path=tmp_path
    ) as fm:
        out = run(context, fm, x)
    cap = clouseau.load(tmp_path)
    want = expected(context, functools.partial(row_points, model), x)
    assert sorted(cap.names()) == sorted(want)
    for name, value in want.items():
        assert_close(cap[name], value, name)
    if shape == "square":  # the check that catches a transpose here is the values' one
        assert np.shape(want["mlp.layers.1"])[-2:] == (5, 5)
    assert_close(out, expected(context, lambda a: model(a), x), "output")


def test_row_mlp_under_grad(tmp_path: Path) -> None:
    model = filled(RowMLP, 4, 3, 6, 2)
    x = jnp.sin(jnp.arange(20.0)).reshape(5, 4)

    def loss(m: Any) -> jax.Array:
        return jnp.sum(m(x) ** 2)

    with clouseau.instrument(model, select=["mlp", "mlp.layers.?"], path=tmp_path) as fm:
        grads = eqx.filter_grad(loss)(fm)
    assert_same_leaves(grads.model, eqx.filter_jit(eqx.filter_grad(loss))(model))
    cap = clouseau.load(tmp_path)
    want = row_points(model, x)
    for name in ("mlp", "mlp.layers.0", "mlp.layers.1", "mlp.layers.2"):
        assert_close(cap[name], want[name], name)


# --- vmaps within vmaps, other axes, outputs that do not depend on the batch -------------------


class Shapes(eqx.Module):
    """A ``Linear`` under two nested vmaps, and under a vmap over axis 1."""

    linear: eqx.nn.Linear

    def __init__(self) -> None:
        self.linear = eqx.nn.Linear(4, 3, use_bias=False, key=KEY)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        nested = jax.vmap(jax.vmap(self.linear))(x.reshape(2, 3, 4))
        by_column = jax.vmap(self.linear, in_axes=1)(x.T)
        return nested, by_column


def test_nested_vmaps_and_other_in_axes(tmp_path: Path) -> None:
    model = filled(Shapes)
    x = jnp.linspace(-2, 2, 24).reshape(6, 4)
    with clouseau.instrument(model, select="linear*", path=tmp_path) as fm:
        nested, by_column = fm(x)
    cap = clouseau.load(tmp_path)
    assert list(cap.names()) == ["linear", "linear_1"]
    assert_close(cap["linear"], jax.vmap(jax.vmap(model.linear))(x.reshape(2, 3, 4)), "linear")
    assert_close(cap["linear_1"], jax.vmap(model.linear)(x), "linear_1")
    want = eqx.filter_jit(model)(x)
    assert_close(nested, want[0], "nested")
    assert_close(by_column, want[1], "by_column")
    # The pins' transposes, and no dead one moving the input vmapped over axis 1.
    names = clouseau.trace(model, x).names()
    assert [n for n in names if "transpose" in n] == [
        "linear.transpose", "transpose", "linear.transpose_1"
    ]  # fmt: skip


class Block(eqx.Module):
    """A block whose ``bias`` submodule does not depend on the vmapped rows."""

    linear: eqx.nn.Linear
    bias: eqx.nn.Linear

    def __init__(self) -> None:
        self.linear = eqx.nn.Linear(4, 3, use_bias=False, key=KEY)
        self.bias = eqx.nn.Linear(2, 3, use_bias=False, key=KEY)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear(x) + self.bias(jnp.ones(2))


class Outer(eqx.Module):
    block: Block

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.cumsum(jax.vmap(self.block)(x), axis=0)


def test_submodule_that_does_not_depend_on_the_batch(tmp_path: Path) -> None:
    # No vmap batches the pin of ``block.bias``: the trace is redone without it, so that
    # no custom_vmap is left for grad to fail on, and ``block.linear`` keeps its own.
    model = filled(lambda: Outer(Block()))
    x = jnp.linspace(-2, 2, 20).reshape(5, 4)
    assert not {p for p in primitives(trace_jaxpr(model, (x,), {}).jaxpr.jaxpr) if "vmap" in p}
    with clouseau.instrument(model, select=["block", "block.*"], path=tmp_path) as fm:
        grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(fm)
    cap = clouseau.load(tmp_path)
    assert_close(cap["block.linear"], jax.vmap(model.block.linear)(x), "block.linear")
    assert_close(cap["block"], jax.vmap(model.block)(x), "block")
    want = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2)))(model)
    assert_same_leaves(grads.model, want)
