"""The JAX cases: Flax NNX example models, Equinox models, Flax linen through ``apply``.

Each case is the thing instrumented, two calls at different shapes, and the expected
value of module points: the submodule called eagerly on the same input (linen: its own
``capture_intermediates`` record, matched by value since linen module outputs have no
module point of their own, see docs/models.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import flax.linen as linen
import flax.nnx as nnx
import jax
import jax.numpy as jnp

Args = tuple[Any, ...]
KEY = jax.random.key(0)


@dataclass(frozen=True)
class JaxCase:
    """``model`` instrumented and called by ``run(model, *args)`` at each of ``calls``;
    ``probes(args)``: point name -> the submodule's eager output on that call's input."""

    name: str
    kind: str
    model: Any
    calls: tuple[Args, ...]
    probes: Callable[[Args], dict[str, Any]]
    run: Callable[..., Any] = lambda model, *args: model(*args)
    by_value: bool = False  # probes are matched against every point by value (linen)


def _x(*shape: int) -> jax.Array:
    return jax.random.normal(jax.random.fold_in(KEY, sum(shape)), shape)


class NnxBlock(nnx.Module):
    """A pre-norm transformer block: attention and an MLP, each with a residual."""

    def __init__(self, width: int, rngs: nnx.Rngs) -> None:
        self.ln1 = nnx.LayerNorm(width, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(2, width, decode=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, 2 * width, rngs=rngs)
        self.down = nnx.Linear(2 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x))
        return x + self.down(nnx.gelu(self.up(self.ln2(x))))


def nnx_transformer() -> JaxCase:
    model = NnxBlock(16, nnx.Rngs(0))

    def probes(args: Args) -> dict[str, Any]:
        (x,) = args
        h = model.ln1(x)
        mid = x + model.attn(h)
        return {"ln1": h, "attn": model.attn(h), "ln2": model.ln2(mid),
                "up": model.up(model.ln2(mid))}  # fmt: skip

    return JaxCase("nnx-transformer", "flax.nnx", model, ((_x(1, 5, 16),), (_x(2, 7, 16),)),
                   probes)  # fmt: skip


class NnxCNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv = nnx.Conv(3, 8, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(8, use_running_average=True, rngs=rngs)
        self.head = nnx.Linear(8, 4, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(nnx.relu(self.bn(self.conv(x))).mean((1, 2)))


def nnx_cnn() -> JaxCase:
    model = NnxCNN(nnx.Rngs(1))

    def probes(args: Args) -> dict[str, Any]:
        conv = model.conv(args[0])
        return {"conv": conv, "bn": model.bn(conv)}

    return JaxCase("nnx-cnn", "flax.nnx", model, ((_x(1, 8, 8, 3),), (_x(2, 12, 12, 3),)), probes)


class NnxRNN(nnx.Module):
    """An Elman RNN whose time loop is ``nnx.scan`` over the cell."""

    def __init__(self, width: int, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Linear(width, width, rngs=rngs)
        self.cell = nnx.Linear(2 * width, width, rngs=rngs)

    def __call__(self, xs: jax.Array) -> jax.Array:
        @nnx.scan(in_axes=(nnx.Carry, None, 0), out_axes=(nnx.Carry, 0))
        def step(h: jax.Array, cell: nnx.Linear, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            h = jnp.tanh(cell(jnp.concatenate([x, h], -1)))
            return h, h

        xs = self.embed(xs)
        _, hs = step(jnp.zeros(xs.shape[1:]), self.cell, xs)
        return hs


def nnx_rnn() -> JaxCase:
    model = NnxRNN(8, nnx.Rngs(2))
    return JaxCase("nnx-rnn-scan", "flax.nnx", model, ((_x(4, 1, 8),), (_x(6, 2, 8),)),
                   lambda args: {"embed": model.embed(args[0])})  # fmt: skip


def eqx_mlp() -> JaxCase:
    """An MLP on vectors, called on batches through ``jax.vmap`` (points keep the batch)."""
    model = eqx.nn.MLP(6, 3, 16, 2, key=KEY)

    def probes(args: Args) -> dict[str, Any]:
        h0 = jax.vmap(model.layers[0])(args[0])
        return {"layers.0": h0, "layers.1": jax.vmap(model.layers[1])(model.activation(h0))}

    return JaxCase("eqx-mlp", "equinox", model, ((_x(2, 6),), (_x(3, 6),)), probes,
                   run=lambda m, x: jax.vmap(m)(x))  # fmt: skip


def eqx_conv() -> JaxCase:
    model = eqx.nn.Sequential([eqx.nn.Conv2d(3, 4, 3, key=KEY), eqx.nn.Lambda(jax.nn.relu),
                               eqx.nn.Conv2d(4, 2, 3, key=jax.random.key(1))])  # fmt: skip

    def probes(args: Args) -> dict[str, Any]:
        h = model.layers[0](args[0])
        return {"layers.0": h, "layers.2": model.layers[2](jax.nn.relu(h))}

    return JaxCase("eqx-conv2d-sequential", "equinox", model, ((_x(3, 8, 8),), (_x(3, 11, 9),)),
                   probes)  # fmt: skip


class EqxAttention(eqx.Module):
    attn: eqx.nn.MultiheadAttention
    norm: eqx.nn.LayerNorm

    def __init__(self, key: jax.Array) -> None:
        self.attn = eqx.nn.MultiheadAttention(2, 16, key=key)
        self.norm = eqx.nn.LayerNorm(16)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.vmap(self.norm)(x)
        return x + self.attn(h, h, h)


def eqx_attention() -> JaxCase:
    model = EqxAttention(KEY)

    def probes(args: Args) -> dict[str, Any]:
        h = jax.vmap(model.norm)(args[0])
        return {"attn": model.attn(h, h, h)}

    return JaxCase("eqx-multihead-attention", "equinox", model, ((_x(5, 16),), (_x(9, 16),)),
                   probes)  # fmt: skip


def eqx_batchnorm() -> JaxCase:
    """``BatchNorm`` with ``eqx.nn.State``, in training mode under ``vmap(axis_name=)``."""
    model, state = eqx.nn.make_with_state(eqx.nn.Sequential)(
        [eqx.nn.Linear(4, 8, key=KEY), eqx.nn.BatchNorm(8, axis_name="batch")]
    )

    def run(m: Any, x: jax.Array, s: Any) -> Any:
        return jax.vmap(m, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, s)

    def probes(args: Args) -> dict[str, Any]:
        return {"layers.0": jax.vmap(model.layers[0])(args[0])}

    return JaxCase("eqx-batchnorm-state", "equinox", model, ((_x(4, 4), state), (_x(6, 4), state)),
                   probes, run=run)  # fmt: skip


class LinenCNN(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = linen.Conv(8, (3, 3))(x)
        x = linen.relu(linen.BatchNorm(use_running_average=True)(x))
        return linen.Dense(4)(x.mean((1, 2)))


def linen_apply() -> JaxCase:
    net = LinenCNN()
    x0, x1 = _x(1, 8, 8, 3), _x(2, 10, 10, 3)
    variables = net.init(jax.random.key(3), x0)

    def probes(args: Args) -> dict[str, Any]:
        _, found = net.apply(*args, capture_intermediates=True, mutable=["intermediates"])
        flat = jax.tree_util.tree_flatten_with_path(found["intermediates"])[0]
        return {jax.tree_util.keystr(path): value for path, value in flat}

    return JaxCase("linen-apply", "flax.linen", net.apply, ((variables, x0), (variables, x1)),
                   probes, by_value=True)  # fmt: skip


CASES: dict[str, Callable[[], JaxCase]] = {
    name: case
    for name, case in (
        ("nnx-transformer", nnx_transformer), ("nnx-cnn", nnx_cnn), ("nnx-rnn-scan", nnx_rnn),
        ("eqx-mlp", eqx_mlp), ("eqx-conv2d-sequential", eqx_conv),
        ("eqx-multihead-attention", eqx_attention), ("eqx-batchnorm-state", eqx_batchnorm),
        ("linen-apply", linen_apply),
    )
}  # fmt: skip
