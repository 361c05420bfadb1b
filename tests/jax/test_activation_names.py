"""``jax.nn`` activations are named by the function, however the model reaches it.

The same model written with ``jax.nn.gelu``, ``from jax.nn import gelu``, an alias and
``flax.nnx.gelu`` has the same point names, and each named value equals the function
applied by hand. Inside ``nnx.MultiHeadAttention`` and ``eqx.nn.MultiheadAttention``,
``"*softmax*"`` selects the attention weights.
"""

from __future__ import annotations

import threading
from typing import Any

import equinox as eqx
import flax.nnx as nnx
import jax
import jax.nn as jnn
import jax.numpy as jnp
import numpy as np
import pytest
from jax.nn import gelu, relu, silu, softmax

from clouseau.capture import jax as cj

RTOL, ATOL = 1e-6, 1e-6
X = jax.random.normal(jax.random.key(0), (2, 6))
W = jax.random.normal(jax.random.key(1), (6, 6)) * 0.5
act = jax.nn.gelu  # an alias held by the user's module


def by_attribute(x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ W)
    return jax.nn.softmax(jax.nn.relu(jax.nn.silu(h) @ W))


def by_import(x: jax.Array) -> jax.Array:
    h = gelu(x @ W)
    return softmax(relu(silu(h) @ W))


def by_alias(x: jax.Array) -> jax.Array:
    h = act(x @ W)
    return jnn.softmax(jnn.relu(jnn.silu(h) @ W))


def by_nnx(x: jax.Array) -> jax.Array:
    h = nnx.gelu(x @ W)
    return nnx.softmax(nnx.relu(nnx.silu(h) @ W))


WAYS = {"attribute": by_attribute, "import": by_import, "alias": by_alias, "nnx": by_nnx}


def reference(x: jax.Array) -> dict[str, np.ndarray]:
    a = x @ W
    h = 0.5 * a * (1 + jnp.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
    s = h / (1 + jnp.exp(-h))
    r = jnp.maximum(s @ W, 0)
    e = jnp.exp(r - r.max(-1, keepdims=True))
    return {"gelu": h, "silu": s, "relu": r, "softmax": e / e.sum(-1, keepdims=True)}


def test_four_ways_give_the_same_names() -> None:
    names = {way: cj.trace(fn, X).names() for way, fn in WAYS.items()}
    assert names["attribute"] == names["import"] == names["alias"] == names["nnx"]
    assert {"gelu", "silu", "relu", "softmax"} <= set(names["import"])


@pytest.mark.parametrize("way", list(WAYS))
def test_named_activations_equal_the_function_by_hand(way: str, sink: Any) -> None:
    fm = cj.instrument(WAYS[way], select=["gelu", "silu", "relu", "softmax"], sink=sink)
    with fm:
        np.testing.assert_allclose(fm(X), jax.jit(WAYS[way])(X), rtol=RTOL, atol=ATOL)
    got = sink.values(0)
    for name, want in reference(X).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_aliases_are_named_as_the_function_they_are() -> None:
    from jax.nn import swish

    names = cj.trace(lambda x: jax.nn.swish(x) + swish(x) + jax.nn.sigmoid(x), X).names()
    assert [n for n in names if n.startswith(("silu", "swish", "sigmoid"))] == [
        "silu",
        "silu_1",
        "sigmoid",
    ]


def test_other_threads_run_the_original_function_during_a_trace() -> None:
    results: list[Any] = []
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            results.append(np.asarray(gelu(X)))

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        for _ in range(3):
            cj.trace(by_import, X)
    finally:
        stop.set()
        thread.join()
    for value in results:
        np.testing.assert_array_equal(value, np.asarray(jax.nn.gelu(X)))


def test_nnx_multi_head_attention_softmax_is_the_attention_weights(sink: Any) -> None:
    x = jax.random.normal(jax.random.key(2), (1, 5, 8))
    model = nnx.MultiHeadAttention(2, 8, rngs=nnx.Rngs(0), decode=False)
    fm = cj.instrument(model, select="*softmax*", sink=sink)
    with fm:
        np.testing.assert_allclose(fm(x), nnx.jit(lambda m, a: m(a))(model, x), atol=1e-5)
    (name,) = sink.values(0)
    q, k = model.query(x), model.key(x)  # (batch, time, heads, head size)
    want = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q / jnp.sqrt(4.0), k), axis=-1)
    got = sink.values(0)[name]
    assert got.size == want.size
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


def test_equinox_multihead_attention_softmax_is_the_attention_weights(sink: Any) -> None:
    x = jax.random.normal(jax.random.key(3), (5, 8))
    model = eqx.nn.MultiheadAttention(2, 8, key=jax.random.key(4))
    fm = cj.instrument(model, select="*softmax*", sink=sink)
    with fm:
        np.testing.assert_allclose(
            fm(x, x, x), eqx.filter_jit(model)(x, x, x), rtol=1e-5, atol=1e-5
        )
    q = jax.vmap(model.query_proj)(x).reshape(5, 2, 4)
    k = jax.vmap(model.key_proj)(x).reshape(5, 2, 4)
    want = jax.nn.softmax(jnp.einsum("thd,shd->hts", q / jnp.sqrt(4.0), k), axis=-1)
    np.testing.assert_allclose(sink.values(0)["softmax"], want, rtol=1e-5, atol=1e-6)
