"""The same model in PyTorch and Equinox gets the same module-output names (up to the key map)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

from clouseau.capture import jax as cj

torch = pytest.importorskip("torch")

KEY = jax.random.PRNGKey(0)


def _module_names(graph: object) -> set[str]:
    return {m.path for m in graph.modules if m.path}  # type: ignore[attr-defined]


def test_sequential_names_match_with_the_key_map() -> None:
    t = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    k1, k2 = jax.random.split(KEY)
    e = eqx.nn.Sequential(
        [eqx.nn.Linear(4, 8, key=k1), eqx.nn.Lambda(jax.nn.relu), eqx.nn.Linear(8, 3, key=k2)]
    )
    graph = cj.trace(e, jnp.zeros(4))
    torch_names = {n for n, _ in t.named_modules() if n}
    assert {cj.map_keys(n, cj.TORCH_KEY_MAP) for n in _module_names(graph)} == torch_names
    assert {
        cj.map_keys(n, cj.TORCH_KEY_MAP)
        for n in graph.names()
        if n.startswith("layers.") and n.count(".") == 1
    } == torch_names


def test_residual_block_names_match() -> None:
    class TorchBlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 8)
            self.act = torch.nn.ReLU()
            self.fc2 = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc2(self.act(self.fc1(x)))

    class EqxBlock(eqx.Module):
        fc1: eqx.nn.Linear
        act: eqx.nn.Lambda
        fc2: eqx.nn.Linear

        def __init__(self, key: jax.Array) -> None:
            k1, k2 = jax.random.split(key)
            self.fc1 = eqx.nn.Linear(4, 8, key=k1)
            self.act = eqx.nn.Lambda(jax.nn.relu)
            self.fc2 = eqx.nn.Linear(8, 4, key=k2)

        def __call__(self, x: jax.Array) -> jax.Array:
            return x + self.fc2(self.act(self.fc1(x)))

    graph = cj.trace(EqxBlock(KEY), jnp.zeros(4))
    torch_names = {n for n, _ in TorchBlock().named_modules() if n}
    assert _module_names(graph) == torch_names == {"fc1", "act", "fc2"}
    assert {"fc1", "act", "fc2", "add"} <= set(graph.names())
