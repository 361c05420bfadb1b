"""The model and data of the two-process JAX tests (imported by the workers and the test)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def model(x: jax.Array) -> jax.Array:
    h = jnp.tanh(x * 0.5)
    total = jnp.sum(h, axis=0)  # replicated over the processes: written once
    return h * total


def inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((8, 6)).astype(np.float32) for _ in range(4)]
