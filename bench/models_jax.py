"""Equinox models for the JAX benchmarks, built in the repo (random weights, no downloads).

The MLP matches the PyTorch one (8 x (Linear 512 + ReLU) on a batch of 64); the
transformer block is one GPT-2 block of the PyTorch decoder's shape (width 384, 6 heads,
sequence 128, batch 2, GELU). Layers act on batched arrays directly (``x @ W.T + b``)
rather than through ``jax.vmap(eqx.nn.Linear)``, so the graph holds one op per layer as
the PyTorch models do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp


@dataclass
class JaxCase:
    """A model with its example input and the glob that selects its activation function."""

    name: str
    model: eqx.Module
    inputs: tuple[jax.Array, ...]
    act_glob: str


class Linear(eqx.Module):
    """A dense layer over the last axis of a batched input."""

    weight: jax.Array
    bias: jax.Array

    def __init__(self, fan_in: int, fan_out: int, key: jax.Array) -> None:
        wkey, bkey = jax.random.split(key)
        lim = 1 / fan_in**0.5  # torch.nn.Linear's initialisation range
        self.weight = jax.random.uniform(wkey, (fan_out, fan_in), minval=-lim, maxval=lim)
        self.bias = jax.random.uniform(bkey, (fan_out,), minval=-lim, maxval=lim)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight.T + self.bias


class MLP(eqx.Module):
    """``depth`` x (Linear(width, width) + ReLU)."""

    layers: list[Linear]

    def __init__(self, depth: int, width: int, key: jax.Array) -> None:
        self.layers = [Linear(width, width, k) for k in jax.random.split(key, depth)]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = jax.nn.relu(layer(x))
        return x


class LayerNorm(eqx.Module):
    """LayerNorm over the last axis, with a learned scale and shift."""

    weight: jax.Array
    bias: jax.Array
    eps: float = eqx.field(static=True, default=1e-5)

    def __init__(self, width: int) -> None:
        self.weight = jnp.ones((width,))
        self.bias = jnp.zeros((width,))

    def __call__(self, x: jax.Array) -> jax.Array:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + self.eps) * self.weight + self.bias


class Attention(eqx.Module):
    """Causal multi-head self-attention with a fused qkv projection (GPT-2's layout)."""

    c_attn: Linear
    c_proj: Linear
    heads: int = eqx.field(static=True)

    def __init__(self, width: int, heads: int, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.c_attn = Linear(width, 3 * width, k1)
        self.c_proj = Linear(width, width, k2)
        self.heads = heads

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, c = x.shape
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)
        q, k, v = (a.reshape(b, t, self.heads, c // self.heads) for a in (q, k, v))
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.reshape(b, t, c))


class FeedForward(eqx.Module):
    """width -> 4 width -> GELU(tanh) -> width."""

    c_fc: Linear
    c_proj: Linear

    def __init__(self, width: int, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.c_fc = Linear(width, 4 * width, k1)
        self.c_proj = Linear(4 * width, width, k2)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=True))


class Block(eqx.Module):
    """A pre-norm GPT-2 block, with the PyTorch block's attribute names."""

    ln_1: LayerNorm
    attn: Attention
    ln_2: LayerNorm
    mlp: FeedForward

    def __init__(self, width: int, heads: int, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.ln_1 = LayerNorm(width)
        self.attn = Attention(width, heads, k1)
        self.ln_2 = LayerNorm(width)
        self.mlp = FeedForward(width, k2)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def mlp_case(tiny: bool = False, quick: bool = False, depth: int | None = None) -> JaxCase:
    """The MLP: 8 x (Linear 512 + ReLU) on a batch of 64."""
    mkey, xkey = jax.random.split(jax.random.key(0))
    depth = depth if depth is not None else (3 if tiny else 8)
    width, batch = (32, 4) if tiny else (512, 64)
    model = MLP(depth, width, mkey)
    return JaxCase("mlp", model, (jax.random.normal(xkey, (batch, width)),), "relu*")


def block_case(tiny: bool = False, quick: bool = False) -> JaxCase:
    """One GPT-2 block: width 384, 6 heads, on 2 x 128 tokens (quick: 1 x 128; tiny: 32 wide)."""
    mkey, xkey = jax.random.split(jax.random.key(0))
    width, heads, batch, seq = (32, 2, 1, 16) if tiny else (384, 6, 1 if quick else 2, 128)
    model = Block(width, heads, mkey)
    return JaxCase("block", model, (jax.random.normal(xkey, (batch, seq, width)),), "gelu*")


CASES: dict[str, Callable[[bool, bool], JaxCase]] = {"mlp": mlp_case, "block": block_case}
