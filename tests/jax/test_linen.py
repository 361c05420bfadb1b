"""Flax linen through ``model.apply``: the variables are parameters, the module is refused."""

from __future__ import annotations

import flax.linen as linen
import jax
import numpy as np
import pytest

import clouseau

RTOL, ATOL = 1e-5, 1e-6


class Net(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = linen.BatchNorm(use_running_average=not train)(linen.Dense(8)(x))
        return linen.Dense(2)(linen.relu(x))


def _net() -> tuple[Net, dict, jax.Array]:
    net, x = Net(), jax.random.normal(jax.random.key(0), (3, 4))
    return net, net.init(jax.random.key(1), x), x


def test_a_linen_module_is_refused_naming_linen_and_apply() -> None:
    net, _, x = _net()
    for call in (lambda: clouseau.instrument(net, select="*", path=None),
                 lambda: clouseau.trace(net, x)):  # fmt: skip
        with pytest.raises(TypeError, match=r"Flax linen module.*model\.apply"):
            call()


def test_a_glob_over_apply_captures_activations_not_the_variables() -> None:
    net, variables, x = _net()
    fmodel = clouseau.instrument(net.apply, select="*", path=None)
    with fmodel:
        for scale in (1.0, 2.0):
            np.testing.assert_allclose(
                fmodel(variables, x * scale), jax.jit(net.apply)(variables, x * scale),
                rtol=RTOL, atol=ATOL,
            )  # fmt: skip
    captured = fmodel.captured
    assert captured.calls == (0, 1)
    leaves = {"params", "batch_stats", "kernel", "bias", "scale", "mean", "var"}
    assert not [n for n in captured.names() if leaves & set(n.split("."))], captured.names()
    # Every submodule's output is a captured value (linen's own record of them).
    _, state = net.apply(variables, x * 2.0, capture_intermediates=True, mutable=["intermediates"])
    outputs = jax.tree_util.tree_leaves(state["intermediates"])
    assert len(outputs) == 4  # Dense_0, BatchNorm_0, Dense_1, and the model itself
    values = [captured.get(name, call=1) for name in captured.names()]
    for output in outputs:
        assert any(
            v.shape == output.shape and np.allclose(v, output, rtol=RTOL, atol=ATOL) for v in values
        )


def test_apply_with_mutable_batch_stats_returns_the_updates() -> None:
    net, variables, x = _net()
    fmodel = clouseau.instrument(net.apply, select="*relu", path=None)
    (y, updates) = fmodel(variables, x, train=True, mutable=["batch_stats"])
    (y_ref, ref) = jax.jit(net.apply, static_argnames=("train", "mutable"))(
        variables, x, train=True, mutable=("batch_stats",)
    )
    np.testing.assert_allclose(y, y_ref, rtol=RTOL, atol=ATOL)
    for a, b in zip(
        jax.tree_util.tree_leaves(updates), jax.tree_util.tree_leaves(ref), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    assert fmodel.captured.names() == ("Net.relu",)
    fmodel.close()
