"""Capture inside a jitted, vmapped JAX step: an Equinox transformer block.

The instrumented module is an Equinox module itself, so it drops into an existing
``eqx.filter_jit`` / ``jax.vmap`` step unchanged; the saves leave through one host
callback per call, and leaving the ``with`` block waits for them.
"""

from __future__ import annotations

import tempfile

import equinox as eqx
import jax

import clouseau


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __init__(self, width: int, heads: int, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.norm1 = eqx.nn.LayerNorm(width)
        self.attn = eqx.nn.MultiheadAttention(heads, width, key=k1)
        self.norm2 = eqx.nn.LayerNorm(width)
        self.fc1 = eqx.nn.Linear(width, 4 * width, key=k2)
        self.fc2 = eqx.nn.Linear(4 * width, width, key=k3)

    def __call__(self, x: jax.Array) -> jax.Array:  # x: (sequence, width)
        h = jax.vmap(self.norm1)(x)
        x = x + self.attn(h, h, h)
        h = jax.vmap(self.norm2)(x)
        return x + jax.vmap(self.fc2)(jax.nn.gelu(jax.vmap(self.fc1)(h)))


def main() -> None:
    block = Block(width=32, heads=4, key=jax.random.PRNGKey(0))
    batch = jax.random.normal(jax.random.PRNGKey(1), (8, 16, 32))  # (batch, sequence, width)
    print("points:", ", ".join(clouseau.trace(block, batch[0]).names()[:12]), "...")

    path = tempfile.mkdtemp(prefix="clouseau-jax-")
    with clouseau.instrument(block, select=["gelu*", "softmax*", "fc2"], path=path) as fblock:

        @eqx.filter_jit
        def step(model: Block, xs: jax.Array) -> jax.Array:
            return jax.vmap(model)(xs).mean()

        for _ in range(3):
            step(fblock, batch)  # no block_until_ready needed: close() waits for the saves

    cap = clouseau.load(path)
    print(f"{len(cap.calls)} calls captured in {path}")
    for name in cap.names():
        print(f"  {name:<24} {cap.get(name, call=0).shape}  (batch axis first, from vmap)")


if __name__ == "__main__":
    main()
