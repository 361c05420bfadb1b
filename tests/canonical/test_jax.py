"""Canonical names on an Equinox transformer, against the same computation by hand."""

from __future__ import annotations

import numpy as np
import pytest

import clouseau

jax = pytest.importorskip("jax")
eqx = pytest.importorskip("equinox")
jnp = jax.numpy

from bench.models_jax import Block, LayerNorm, Linear  # noqa: E402


class GPT(eqx.Module):
    """Token embedding, two pre-norm GPT-2 blocks, a final norm and an unembedding."""

    wte: jax.Array
    blocks: list
    ln_f: LayerNorm
    head: Linear

    def __init__(self, key: jax.Array) -> None:
        keys = jax.random.split(key, 4)
        self.wte = jax.random.normal(keys[0], (64, 32))
        self.blocks = [Block(32, 4, k) for k in keys[1:3]]
        self.ln_f = LayerNorm(32)
        self.head = Linear(32, 64, keys[3])

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = self.wte[ids]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _by_hand(model: GPT, ids: jax.Array) -> dict[str, np.ndarray]:
    found = {}
    found["embed"] = x = model.wte[ids]
    for i, block in enumerate(model.blocks):
        found[f"blocks.{i}.resid_pre"] = x
        h = block.ln_1(x)
        b, t, c = h.shape
        q, k, _ = jnp.split(block.attn.c_attn(h), 3, axis=-1)
        q, k = (a.reshape(b, t, 4, c // 4) for a in (q, k))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(c // 4)
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
        found[f"blocks.{i}.attn.pattern"] = jax.nn.softmax(scores, axis=-1)
        found[f"blocks.{i}.attn_out"] = attn = block.attn(h)
        found[f"blocks.{i}.resid_mid"] = mid = x + attn
        found[f"blocks.{i}.mlp_out"] = mlp = block.mlp(block.ln_2(mid))
        found[f"blocks.{i}.resid_post"] = x = mid + mlp
    found["ln_final"] = model.ln_f(x)
    found["logits"] = model.head(found["ln_final"])
    return {name: np.asarray(v) for name, v in found.items()}


def test_equinox_transformer_gets_canonical_names() -> None:
    model = GPT(jax.random.key(0))
    ids = jnp.array([[1, 2, 3, 4, 5, 6]])
    want = _by_hand(model, ids)
    names = set(clouseau.trace(model, ids).names())
    assert set(want) <= names, sorted(set(want) - names)
    assert {"blocks.0.attn.q", "blocks.0.mlp.pre", "blocks.1.hook_resid_post"} <= names
    fmodel = clouseau.instrument(model, select=sorted(want), path=None)
    out = fmodel(ids)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(eqx.filter_jit(model)(ids)))
    cap = fmodel.captured
    for name, value in want.items():
        got = cap[name].reshape(value.shape)  # the pattern keeps jax's group axis
        np.testing.assert_allclose(got, value, rtol=0, atol=1e-5, err_msg=name)
