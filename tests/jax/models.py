"""Small models of the JAX frontend tests, each with a hand-written reference.

A reference recomputes the model from its parameters with plain jax.numpy (no Equinox
layer, no jax.nn activation) and returns every intermediate the test saves, by the
point name clouseau should give it. Values inside a ``lax.scan`` are stacked along a
leading iteration axis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def _linear(layer: eqx.nn.Linear, x: Array) -> Array:
    return layer.weight @ x + layer.bias


def _layer_norm(ln: eqx.nn.LayerNorm, x: Array) -> Array:
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    return (x - mean) / jnp.sqrt(var + ln.eps) * ln.weight + ln.bias


def _gelu_tanh(x: Array) -> Array:
    return 0.5 * x * (1 + jnp.tanh(jnp.sqrt(2 / jnp.pi) * (x + 0.044715 * x**3)))


def _softmax(x: Array) -> Array:
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --- an MLP ---------------------------------------------------------------------------


class MLP(eqx.Module):
    layers: list[eqx.nn.Linear]

    def __init__(self, sizes: tuple[int, ...], *, key: Array) -> None:
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = [
            eqx.nn.Linear(a, b, key=k) for a, b, k in zip(sizes[:-1], sizes[1:], keys, strict=True)
        ]

    def __call__(self, x: Array) -> Array:
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


def mlp_reference(model: MLP, x: Array) -> dict[str, Array]:
    out: dict[str, Array] = {}
    for i, layer in enumerate(model.layers[:-1]):
        x = _linear(layer, x)
        out[f"layers.{i}"] = x
        x = jnp.maximum(x, 0)
        out["relu" if i == 0 else f"relu_{i}"] = x
    out[f"layers.{len(model.layers) - 1}"] = _linear(model.layers[-1], x)
    return out


# --- a CNN: Conv2d + GroupNorm + relu -------------------------------------------------


class CNN(eqx.Module):
    conv: eqx.nn.Conv2d
    norm: eqx.nn.GroupNorm
    head: eqx.nn.Linear

    def __init__(self, *, key: Array) -> None:
        k1, k2 = jax.random.split(key)
        self.conv = eqx.nn.Conv2d(3, 4, kernel_size=3, padding=1, key=k1)
        self.norm = eqx.nn.GroupNorm(2, 4)
        self.head = eqx.nn.Linear(4, 5, key=k2)

    def __call__(self, x: Array) -> Array:
        h = jax.nn.relu(self.norm(self.conv(x)))
        return self.head(h.mean(axis=(1, 2)))


def cnn_reference(model: CNN, x: Array) -> dict[str, Array]:
    conv = (
        jax.lax.conv_general_dilated(
            x[None], model.conv.weight, window_strides=(1, 1), padding=((1, 1), (1, 1))
        )[0]
        + model.conv.bias
    )
    groups = conv.reshape(2, -1, *conv.shape[1:])
    mean = groups.mean(axis=(1, 2, 3), keepdims=True)
    var = ((groups - mean) ** 2).mean(axis=(1, 2, 3), keepdims=True)
    normed = ((groups - mean) / jnp.sqrt(var + model.norm.eps)).reshape(conv.shape)
    normed = normed * model.norm.weight[:, None, None] + model.norm.bias[:, None, None]
    relu = jnp.maximum(normed, 0)
    head = _linear(model.head, relu.mean(axis=(1, 2)))
    return {"conv": conv, "norm": normed, "relu": relu, "head": head}


# --- a transformer block: LayerNorm, multi-head attention with softmax, gelu MLP ------


class Attention(eqx.Module):
    qkv: eqx.nn.Linear
    proj: eqx.nn.Linear
    heads: int = eqx.field(static=True)

    def __init__(self, dim: int, heads: int, *, key: Array) -> None:
        k1, k2 = jax.random.split(key)
        self.qkv = eqx.nn.Linear(dim, 3 * dim, key=k1)
        self.proj = eqx.nn.Linear(dim, dim, key=k2)
        self.heads = heads

    def __call__(self, x: Array) -> Array:
        q, k, v = _heads(jax.vmap(self.qkv)(x), self.heads)
        weights = jax.nn.softmax(q @ k.swapaxes(-1, -2) / jnp.sqrt(q.shape[-1]), axis=-1)
        y = (weights @ v).swapaxes(0, 1).reshape(x.shape)
        return jax.vmap(self.proj)(y)


def _heads(qkv: Array, heads: int) -> tuple[Array, Array, Array]:
    t, three_d = qkv.shape
    q, k, v = jnp.split(qkv, 3, axis=-1)
    return tuple(a.reshape(t, heads, three_d // 3 // heads).swapaxes(0, 1) for a in (q, k, v))  # type: ignore[return-value]


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    attn: Attention
    ln2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __init__(self, dim: int = 8, heads: int = 2, *, key: Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln1 = eqx.nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, key=k1)
        self.ln2 = eqx.nn.LayerNorm(dim)
        self.fc1 = eqx.nn.Linear(dim, 2 * dim, key=k2)
        self.fc2 = eqx.nn.Linear(2 * dim, dim, key=k3)

    def __call__(self, x: Array) -> Array:
        x = x + self.attn(jax.vmap(self.ln1)(x))
        h = jax.nn.gelu(jax.vmap(self.fc1)(jax.vmap(self.ln2)(x)))
        return x + jax.vmap(self.fc2)(h)


def block_reference(model: Block, x: Array) -> dict[str, Array]:
    ln1 = jax.vmap(lambda r: _layer_norm(model.ln1, r))(x)
    qkv = jax.vmap(lambda r: _linear(model.attn.qkv, r))(ln1)
    q, k, v = _heads(qkv, model.attn.heads)
    weights = _softmax(q @ k.swapaxes(-1, -2) / jnp.sqrt(q.shape[-1]))
    y = (weights @ v).swapaxes(0, 1).reshape(x.shape)
    attn = jax.vmap(lambda r: _linear(model.attn.proj, r))(y)
    x1 = x + attn
    ln2 = jax.vmap(lambda r: _layer_norm(model.ln2, r))(x1)
    fc1 = jax.vmap(lambda r: _linear(model.fc1, r))(ln2)
    gelu = _gelu_tanh(fc1)
    fc2 = jax.vmap(lambda r: _linear(model.fc2, r))(gelu)
    return {
        "ln1": ln1, "attn.qkv": qkv, "attn.softmax": weights, "attn.proj": attn, "attn": attn,
        "add": x1, "ln2": ln2, "fc1": fc1, "gelu": gelu, "fc2": fc2, "add_1": x1 + fc2,
    }  # fmt: skip


# --- a plain function: lax.scan over stacked layer weights ----------------------------


def scan_mlp(params: dict[str, Array], x: Array) -> Array:
    def body(h: Array, wb: tuple[Array, Array]) -> tuple[Array, None]:
        w, b = wb
        return jax.nn.tanh(w @ h + b), None

    h, _ = jax.lax.scan(body, x, (params["w"], params["b"]))
    return h @ params["out"]


def scan_params(key: Array, depth: int = 3, dim: int = 6) -> dict[str, Array]:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w": jax.random.normal(k1, (depth, dim, dim)) / jnp.sqrt(dim),
        "b": jax.random.normal(k2, (depth, dim)) * 0.1,
        "out": jax.random.normal(k3, (dim, 2)),
    }


def scan_reference(params: dict[str, Array], x: Array) -> dict[str, Array]:
    pre, tanh = [], []
    h = x
    for w, b in zip(params["w"], params["b"], strict=True):
        pre.append(w @ h + b)
        h = jnp.tanh(pre[-1])
        tanh.append(h)
    return {
        "scan.add": jnp.stack(pre),
        "scan.tanh": jnp.stack(tanh),
        "scan": h,
        "dot_general": h @ params["out"],
    }


# --- the cases the tests run ----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A model, how to call it on one example, and its reference intermediates."""

    name: str
    model: Any
    example: Array
    call: Callable[[Any, Array], Array]
    reference: Callable[[Any, Array], dict[str, Array]]
    loops: frozenset[str] = frozenset()  # names saved once per scan iteration


def cases() -> tuple[Case, ...]:
    key = jax.random.PRNGKey(0)
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    mlp = MLP((4, 8, 8, 3), key=k1)
    cnn = CNN(key=k2)
    block = Block(key=k3)
    params = scan_params(k4)

    def call_scan(fn: Any, x: Array) -> Array:
        return fn(params, x)

    # References run jitted: op-by-op eager dispatch would dominate the test time.
    mlp_ref = jax.jit(lambda x: mlp_reference(mlp, x))
    cnn_ref = jax.jit(lambda x: cnn_reference(cnn, x))
    block_ref = jax.jit(lambda x: block_reference(block, x))
    scan_ref = jax.jit(lambda x: scan_reference(params, x))
    return (
        Case("mlp", mlp, jax.random.normal(k5, (4,)), lambda m, x: m(x), lambda m, x: mlp_ref(x)),
        Case("cnn", cnn, jax.random.normal(k5, (3, 6, 6)), lambda m, x: m(x), lambda m, x: cnn_ref(x)),
        Case("block", block, jax.random.normal(k5, (5, 8)), lambda m, x: m(x), lambda m, x: block_ref(x)),
        Case(
            "scan", scan_mlp, jax.random.normal(k5, (6,)), call_scan, lambda m, x: scan_ref(x),
            loops=frozenset({"scan.add", "scan.tanh"}),
        ),
    )  # fmt: skip


def numpy_init(cls: Callable[..., Any], *args: Any, seed: int = 0, **kwargs: Any) -> Any:
    """``cls(*args, **kwargs)`` with its weights drawn by numpy.

    Equinox draws initial weights with jax.random op by op, and every draw of every new
    shape compiles: seconds per model. Only the shapes are traced here, then filled in.
    """
    rng = np.random.default_rng(seed)
    shapes = eqx.filter_eval_shape(cls, *args, **kwargs)

    def fill(leaf: Any) -> Any:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return jnp.asarray(rng.uniform(-0.6, 0.6, leaf.shape).astype(leaf.dtype))
        return leaf

    return jax.tree_util.tree_map(fill, shapes)
