"""Small JAX / Equinox models shared by the reliability tests (issue 7)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def value_branch(x: jax.Array) -> jax.Array:
    y = jnp.tanh(x)
    if y.sum() > 0:  # JAX-BRANCH-LINE
        return jax.nn.relu(y)
    return -y


def mlp(x: jax.Array) -> jax.Array:
    w = jnp.arange(16.0, dtype=jnp.float32).reshape(4, 4) / 16
    return jax.nn.relu(x @ w)


class Stack(eqx.Module):
    """Linear+ReLU blocks; ``layers.<i>`` is the Linear's output."""

    layers: list[eqx.nn.Linear]

    def __init__(self, width: int = 16, depth: int = 4, seed: int = 0) -> None:
        keys = jax.random.split(jax.random.PRNGKey(seed), depth)
        self.layers = [eqx.nn.Linear(width, width, key=k) for k in keys]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = jax.nn.relu(layer(x))
        return x.sum()


def eager_layers(model: Stack, x: np.ndarray) -> list[np.ndarray]:
    """Every Linear's output of ``model`` on ``x``, computed without clouseau."""
    out = []
    h = jnp.asarray(x)
    for layer in model.layers:
        h = layer(h)
        out.append(np.asarray(h))
        h = jax.nn.relu(h)
    return out
