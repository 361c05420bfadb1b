"""Check a port between frameworks: the same MLP in PyTorch and Equinox, compared point by point.

Both captures are written to disk, then ``clouseau.diff`` (the ``clouseau diff`` command)
matches the names through a key map: an ``eqx.nn.Sequential`` keeps its children in
``layers``, so Equinox's ``layers.0`` is PyTorch's ``0``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import torch

import clouseau


def torch_mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def equinox_port(model: torch.nn.Sequential) -> eqx.nn.Sequential:
    """The same weights in Equinox (its Linear stores weight as (out, in) like PyTorch)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    layers = [
        eqx.nn.Linear(8, 16, key=keys[0]),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Linear(16, 4, key=keys[1]),
    ]
    port = eqx.nn.Sequential(layers)
    for i in (0, 2):
        weight = jnp.asarray(model[i].weight.detach().numpy())
        bias = jnp.asarray(model[i].bias.detach().numpy())
        port = eqx.tree_at(
            lambda m, i=i: (m.layers[i].weight, m.layers[i].bias), port, (weight, bias)
        )
    return port


def main() -> None:
    model = torch_mlp().eval()
    port = equinox_port(model)
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    root = Path(tempfile.mkdtemp(prefix="clouseau-port-"))

    with clouseau.instrument(model, select=["0", "1", "2"], path=root / "torch") as fmodel:
        fmodel(torch.from_numpy(x))
    with clouseau.instrument(port, select=["layers.?"], path=root / "jax") as fport:
        jax.vmap(fport)(jnp.asarray(x))

    result = clouseau.diff(root / "jax", root / "torch", key_map={r"^layers\.": ""})
    print(result.summary())
    print(
        f"\nThe same from a shell: clouseau diff {root / 'jax'} {root / 'torch'} --key-map '^layers\\.' ''"
    )


if __name__ == "__main__":
    main()
