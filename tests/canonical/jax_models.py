"""Small JAX transformers for the canonical tests: Flax NNX, and Equinox with jax's fused
attention (grouped-query heads, a bias or a boolean mask, a scale)."""

from __future__ import annotations

import equinox as eqx
import flax.nnx as nnx
import jax
import jax.numpy as jnp

from bench.models_jax import LayerNorm, Linear

WIDTH, HEADS, VOCAB = 32, 4, 64


class NnxBlock(nnx.Module):
    """A pre-norm GPT-2 block of nnx layers (nnx.MultiHeadAttention runs jax's kernel)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.ln_1 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(HEADS, WIDTH, decode=False, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.up = nnx.Linear(WIDTH, 4 * WIDTH, rngs=rngs)
        self.down = nnx.Linear(4 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln_1(x), mask=mask)
        return x + self.down(nnx.gelu(self.up(self.ln_2(x))))


class NnxGPT(nnx.Module):
    """Token and position embeddings, two blocks, a final norm and an unembedding."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.wte = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.wpe = nnx.Embed(16, WIDTH, rngs=rngs)
        self.blocks = nnx.List([NnxBlock(rngs) for _ in range(2)])
        self.ln_f = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        # Positions from the ids, as Hugging Face's from the attention mask (arange
        # positions would be a constant of the graph, not a point).
        positions = jnp.cumsum(ids >= 0, axis=-1) - 1
        x = self.wte(ids) + self.wpe(positions)
        mask = nnx.make_causal_mask(ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


class GqaAttention(eqx.Module):
    """Grouped-query attention through ``jax.nn.dot_product_attention``."""

    q_proj: Linear
    kv_proj: Linear
    o_proj: Linear
    bias: bool = eqx.field(static=True)

    def __init__(self, key: jax.Array, *, bias: bool) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.q_proj = Linear(WIDTH, WIDTH, k1)
        self.kv_proj = Linear(WIDTH, WIDTH, k2)  # two key-value heads: k and v
        self.o_proj = Linear(WIDTH, WIDTH, k3)
        self.bias = bias

    def __call__(self, x: jax.Array, extra: jax.Array) -> jax.Array:
        b, t, c = x.shape
        q = self.q_proj(x).reshape(b, t, HEADS, c // HEADS)
        k, v = (a.reshape(b, t, 2, c // HEADS) for a in jnp.split(self.kv_proj(x), 2, -1))
        if self.bias:  # an additive float bias (ALiBi-like) with its own scale
            y = jax.nn.dot_product_attention(q, k, v, extra, scale=0.3)
        else:  # a boolean mask (padding) and causality
            y = jax.nn.dot_product_attention(q, k, v, mask=extra, is_causal=True)
        return self.o_proj(y.reshape(b, t, c))


class GqaBlock(eqx.Module):
    ln_1: LayerNorm
    attn: GqaAttention
    ln_2: LayerNorm
    mlp: Linear

    def __init__(self, key: jax.Array, *, bias: bool) -> None:
        self.ln_1, self.ln_2 = LayerNorm(WIDTH), LayerNorm(WIDTH)
        k1, k2 = jax.random.split(key)
        self.attn = GqaAttention(k1, bias=bias)
        self.mlp = Linear(WIDTH, WIDTH, k2)

    def __call__(self, x: jax.Array, extra: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln_1(x), extra)
        return x + self.mlp(jax.nn.gelu(self.ln_2(x)))


class GqaModel(eqx.Module):
    """Two blocks (a biased one, a masked causal one) on float inputs, a norm and a head."""

    blocks: list
    ln_f: LayerNorm
    head: Linear

    def __init__(self, key: jax.Array) -> None:
        k0, k1, k2 = jax.random.split(key, 3)
        self.blocks = [GqaBlock(k0, bias=True), GqaBlock(k1, bias=False)]
        self.ln_f = LayerNorm(WIDTH)
        self.head = Linear(WIDTH, VOCAB, k2)

    def __call__(self, x: jax.Array) -> jax.Array:
        t = x.shape[-2]
        pos = jnp.arange(t)
        alibi = (
            -0.5 * jnp.abs(pos[:, None] - pos[None, :]) * jnp.arange(1, HEADS + 1)[:, None, None]
        )
        keep = jnp.broadcast_to(pos < t - 1, (1, 1, t, t))  # the last position is padding
        x = self.blocks[0](x, alibi[None])
        x = self.blocks[1](x, keep)
        return self.head(self.ln_f(x))
