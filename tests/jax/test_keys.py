"""The equation-key grammar (clouseau.ir.keys) and the JAX frontend's primitive families."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import clouseau
from clouseau.capture.jax import keys
from clouseau.ir import keys as ir_keys

# (constructor, arguments, key, steps): one row per constructor, at the top and nested.
TABLE = [
    (keys.equation_key, (keys.ROOT, 3), "3", ("3",)),
    (keys.equation_key, ("3/0", 5), "3/0/5", ("3", "0", "5")),
    (keys.const_key, (keys.ROOT, 0), "c0", ("c0",)),
    (keys.const_key, ("2", 1), "2/c1", ("2", "c1")),
    (keys.input_key, (keys.ROOT, 12), "in12", ("in12",)),
    (keys.input_key, ("4", 1), "4/in1", ("4", "in1")),
    (keys.branch_key, ("3", 1), "3/b1", ("3", "b1")),
    (keys.body_key, ("3",), "3/body", ("3", "body")),
    (keys.cond_key, ("3",), "3/cond", ("3", "cond")),
    (keys.index_key, ("3/b0/2",), "3/b0/2/index", ("3", "b0", "2", "index")),
    (keys.count_key, ("7",), "7/count", ("7", "count")),
]


@pytest.mark.parametrize(("make", "args", "key", "steps"), TABLE)
def test_constructors_build_keys_that_parse_back(make, args, key, steps):
    assert make(*args) == key
    assert keys.parse_key(key) == steps
    assert "/".join(keys.parse_key(key)) == key


@pytest.mark.parametrize(
    "bad",
    ["", "3//1", "/3", "3/", "x1", "in", "c", "b-1", "01", "3/index/0", "3/count/in0", "body1"],
)
def test_malformed_keys_are_refused_naming_the_step(bad):
    with pytest.raises(ValueError, match="is not an equation key"):
        keys.parse_key(bad)


def test_enclosing_inside_and_branch_of():
    key = keys.equation_key(keys.branch_key(keys.equation_key("3", 0), 1), 4)
    assert key == "3/0/b1/4"
    assert keys.enclosing(key) == ["3", "3/0", "3/0/b1"]
    assert keys.is_inside(key, "3/0") and not keys.is_inside(key, key)
    assert not keys.is_inside("30/1", "3")
    assert keys.branch_of(key, "3/0") == 1
    with pytest.raises(ValueError, match="not in a branch"):
        keys.branch_of("3/0/body/1", "3/0")
    with pytest.raises(ValueError, match="not inside"):
        keys.branch_of("4/b0/1", "3")


def test_the_frontend_reexports_the_ir_grammar():
    for name in ("equation_key", "const_key", "input_key", "parse_key", "enclosing"):
        assert getattr(keys, name) is getattr(ir_keys, name)


def test_the_onnx_exporter_inlines_every_call_the_frontend_opens():
    pytest.importorskip("onnx")
    from clouseau.exporters.onnx_jax import CALLS

    assert set(CALLS) >= keys.CALLS | keys.REMAT | keys.CUSTOM


def test_every_key_of_a_traced_graph_parses():
    @jax.custom_jvp
    def soft(x):
        return jnp.tanh(x)

    soft.defjvp(lambda p, t: (soft(p[0]), t[0]))

    def model(x):
        def body(c, xs):
            return jax.lax.cond(c.sum() > 0, jnp.sin, jnp.cos, c * xs), c

        c, _ = jax.lax.scan(body, x[0], x)
        w = jax.lax.while_loop(lambda v: v.sum() < 10.0, lambda v: v + 1.0, c)
        return jax.checkpoint(soft)(w) + 1.0

    graph = clouseau.trace(model, jnp.ones((3, 2)))
    found = [n.key for n in graph.nodes if n.key]
    for key in found:
        keys.parse_key(key)
    steps = {s for k in found for s in keys.parse_key(k)}
    assert {"in0", "b0", "b1", "body"} <= steps
