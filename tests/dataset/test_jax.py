"""clouseau.record over a JAX data iterator: an Equinox model and a plain JAX function,
each called inside the user's jit, against ``jax.jit`` of the original."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
eqx = pytest.importorskip("equinox")

import jax.numpy as jnp  # noqa: E402

import clouseau  # noqa: E402


class Block(eqx.Module):
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.fc1 = eqx.nn.Linear(8, 16, key=k1)
        self.fc2 = eqx.nn.Linear(16, 4, key=k2)

    def __call__(self, x):
        return jax.vmap(self.fc2)(jax.nn.relu(jax.vmap(self.fc1)(x)))


def _batches(n=7):
    key = jax.random.PRNGKey(3)
    for k in range(n):  # a generator of device arrays: no length
        yield jax.random.normal(jax.random.fold_in(key, k), (5, 8))


def test_equinox_module_inside_the_users_filter_jit(tmp_path):
    model = Block(jax.random.PRNGKey(0))
    step = eqx.filter_jit(lambda fmodel, x: fmodel(x))
    cap = clouseau.record(
        model, _batches(), select="fc1", path=tmp_path / "cap", forward=step, stats=True,
        progress=False,
    )  # fmt: skip
    expected = jax.jit(lambda x: jax.vmap(model.fc1)(x))
    assert cap.calls == tuple(range(7))
    for k, x in enumerate(_batches()):
        np.testing.assert_allclose(cap.get("fc1", call=k), expected(x), rtol=1e-6, atol=1e-6)
    rows = np.concatenate([np.asarray(expected(x)) for x in _batches()]).astype(np.float64)
    np.testing.assert_allclose(cap.stats("fc1").mean, rows.mean(0), rtol=1e-5, atol=1e-6)
    got = np.concatenate(list(cap.iter_batches("fc1", 8, shuffle=False)))
    np.testing.assert_array_equal(got, np.asarray(cap.array("fc1")))


W1 = jax.random.normal(jax.random.PRNGKey(1), (8, 16))
W2 = jax.random.normal(jax.random.PRNGKey(2), (16, 4))


def mlp(x):
    return jnp.tanh(x @ W1) @ W2


def test_plain_function_inside_the_users_jit(tmp_path):
    step = jax.jit(lambda fmodel, x: fmodel(x), static_argnums=0)
    cap = clouseau.record(
        mlp, _batches(), select="tanh", path=tmp_path / "cap", forward=step, progress=False
    )
    expected = jax.jit(lambda x: jnp.tanh(x @ W1))
    assert cap.calls == tuple(range(7))
    for k, x in enumerate(_batches()):
        np.testing.assert_allclose(cap.get("tanh", call=k), expected(x), rtol=1e-6, atol=1e-6)
    batch = next(cap.iter_batches("tanh", 10, seed=0, format="jax"))
    assert isinstance(batch, jax.Array) and batch.shape == (10, 16)
