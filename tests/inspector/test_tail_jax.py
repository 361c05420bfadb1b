"""inspector.tail on JAX/Equinox models, checked against direct (eager) submodule calls."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
eqx = pytest.importorskip("equinox")
jnp = jax.numpy

import clouseau  # noqa: E402
from clouseau import inspector  # noqa: E402
from tests.jax.models import numpy_init as build  # noqa: E402

Filter = Callable[[tuple[str, ...], Any], bool]
KEY = jax.random.PRNGKey(0)


class Block(eqx.Module):
    linear1: eqx.nn.Linear
    act: eqx.nn.Lambda
    linear2: eqx.nn.Linear
    scale: float = 0.5  # a float field: a leaf that is neither an array nor a module

    def __init__(self, width: int, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.linear1 = eqx.nn.Linear(width, 2 * width, key=k1)
        self.act = eqx.nn.Lambda(jax.nn.relu)
        self.linear2 = eqx.nn.Linear(2 * width, width, key=k2)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.scale * self.linear2(self.act(self.linear1(x)))


class Net(eqx.Module):
    embed: eqx.nn.Linear
    blocks: list[Block]
    dropout: eqx.nn.Dropout
    head: eqx.nn.Linear

    def __init__(self, width: int = 4, key: jax.Array = KEY) -> None:
        k0, k1, k2, k3 = jax.random.split(key, 4)
        self.embed = eqx.nn.Linear(3, width, key=k0)
        self.blocks = [Block(width, k1), Block(width, k2)]
        self.dropout = eqx.nn.Dropout(0.5, inference=True)
        self.head = eqx.nn.Linear(width, 2, key=k3)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.dropout(h))


@eqx.filter_jit  # one compilation instead of one per op and shape: keeps the tests fast
def eager(model: Net, x: jax.Array) -> dict[str, jax.Array]:
    """Every module output of ``model(x)``, by calling each submodule directly."""
    out = {"embed.__call__": model.embed(x)}
    h = out["embed.__call__"]
    for i, block in enumerate(model.blocks):
        a = out[f"blocks.{i}.linear1.__call__"] = block.linear1(h)
        a = out[f"blocks.{i}.act.__call__"] = block.act(a)
        a = out[f"blocks.{i}.linear2.__call__"] = block.linear2(a)
        h = out[f"blocks.{i}.__call__"] = h + block.scale * a
    out["dropout.__call__"] = model.dropout(h)
    out["head.__call__"] = out["__call__"] = model.head(h)
    return out


def assert_close(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert np.shape(got[key]) == np.shape(value), key
        np.testing.assert_allclose(
            np.asarray(got[key]), np.asarray(value), rtol=1e-5, atol=1e-6, err_msg=key
        )


class TimeModel(eqx.Module):
    """A model called as ``model(x, time)``, as in the seed's docstring."""

    mlp: eqx.nn.MLP
    time_embed: eqx.nn.Linear

    def __init__(self, key: jax.Array = KEY) -> None:
        k1, k2 = jax.random.split(key)
        self.mlp = eqx.nn.MLP(4, 4, 8, 1, key=k1)
        self.time_embed = eqx.nn.Linear("scalar", 4, key=k2)

    def __call__(self, x: jax.Array, time: jax.Array) -> jax.Array:
        return self.mlp(x + self.time_embed(time))


def test_seed_docstring_example_runs_as_written() -> None:
    model, x, time = build(TimeModel), jnp.arange(4.0), jnp.asarray(0.3)
    with inspector.tail(model, path=".clouseau/trace-jax.safetensors") as fmodel:
        fmodel(x, time).block_until_ready()
    data = inspector.read_from_safetensors(".clouseau/trace-jax.safetensors", framework="jax")
    t = model.time_embed(time)
    want = {"time_embed.__call__": t, "__call__": model(x, time), "mlp.__call__": model.mlp(x + t)}
    h = x + t
    for i, layer in enumerate(model.mlp.layers):
        h = want[f"mlp.layers.{i}.__call__"] = layer(h)
        h = jax.nn.relu(h) if i < len(model.mlp.layers) - 1 else h
    assert_close(data, want)


def test_default_records_every_callable_node_without_blocking() -> None:
    model, x = build(Net), jnp.arange(3.0)
    with inspector.tail(model, path="run") as fmodel:
        y = fmodel(x)  # no block_until_ready: leaving the block waits for the saves
    np.testing.assert_allclose(y, model(x), rtol=1e-5, atol=1e-6)
    assert_close(inspector.read_from_safetensors("run"), eager(model, x))


@pytest.mark.parametrize(
    ("filter_", "modules"),
    [
        pytest.param(
            lambda p, n: isinstance(n, eqx.nn.Linear),
            ("embed", "head", "linear1", "linear2"),
            id="by-class",
        ),
        pytest.param(lambda p, n: "linear" in p[-1], ("linear1", "linear2"), id="by-path"),
    ],
)
def test_filter_records_exactly_the_chosen_modules(
    filter_: Filter, modules: tuple[str, ...]
) -> None:
    model, x = build(Net), jnp.arange(3.0)
    with inspector.tail(model, path="run", filter_=filter_) as fmodel:
        fmodel(x)
    want = {
        k: v
        for k, v in eager(model, x).items()
        if k.split(".")[-2:-1] and k.split(".")[-2] in modules
    }
    assert want
    assert_close(inspector.read_from_safetensors("run"), want)


def test_filter_and_is_leaf_see_tuples_of_strings() -> None:
    seen: list[tuple[str, ...]] = []

    def filter_(path: tuple[str, ...], node: Any) -> bool:
        seen.append(path)
        return isinstance(node, Block)

    model, x = build(Net), jnp.arange(3.0)
    with inspector.tail(
        model, path="run", filter_=filter_, is_leaf=lambda p, n: isinstance(n, Block)
    ) as fmodel:
        fmodel(x)
    assert all(isinstance(p, tuple) and all(type(s) is str for s in p) for p in seen)
    assert ("blocks", "0") in seen and ("blocks", "0", "linear1") not in seen
    want = {
        k: v for k, v in eager(model, x).items() if k in ("blocks.0.__call__", "blocks.1.__call__")
    }
    assert_close(inspector.read_from_safetensors("run"), want)


def test_five_calls_and_jit_inside_the_block() -> None:
    model = build(Net)
    xs = [jnp.linspace(-i, i + 1, 3) for i in range(5)]
    with inspector.tail(model, path="run") as fmodel:
        fmodel(xs[0])
        jitted = jax.jit(lambda x: fmodel(x))
        jitted(xs[1])
        jitted(xs[2])
        eqx.filter_jit(fmodel)(xs[3])
        jax.vmap(fmodel)(xs[4][None])  # saved with the batch axis
    data = inspector.read_from_safetensors("run")
    for call, x in enumerate(xs):
        suffix = f"#{call}" if call else ""
        want = {k + suffix: (v[None] if call == 4 else v) for k, v in eager(model, x).items()}
        assert_close({k: v for k, v in data.items() if k in want}, want)
    assert len(data) == 5 * len(eager(model, xs[0]))


def test_files_roll_over_at_max_size_mb() -> None:
    model, x = build(Net), jnp.ones(3)  # 16 or 32 bytes per module output: one file each
    with inspector.tail(
        model, path="run", max_size_mb=1e-5, filename_pattern="part-{idx:02d}.safetensors"
    ) as fmodel:
        fmodel(x)
    files = sorted(Path("run").glob("part-*.safetensors"))
    assert len(files) > 3
    pieces: dict[str, np.ndarray] = {}
    for file in files:
        piece = inspector.read_from_safetensors(file)
        assert len({id(v) for v in piece.values()}) == 1  # one array (under all its keys)
        pieces.update(piece)
    assert list(pieces) == list(inspector.read_from_safetensors("run"))
    assert_close(pieces, eager(model, x))


def test_two_nested_recorders_stay_isolated_across_frameworks() -> None:
    torch = pytest.importorskip("torch")
    jax_model, x = build(Net), jnp.arange(3.0)
    torch_model, t = torch.nn.Sequential(torch.nn.Linear(3, 2)), torch.ones(1, 3)
    with inspector.tail(jax_model, path="j") as fj, inspector.tail(torch_model, path="t") as ft:
        fj(x)
        ft(t)
        fj(x)
    want = eager(jax_model, x)
    assert_close(
        inspector.read_from_safetensors("j"), {**want, **{k + "#1": v for k, v in want.items()}}
    )
    got = inspector.read_from_safetensors("t")
    assert list(got) == ["0.__call__", "__call__"]  # the root's output is its last layer's
    np.testing.assert_array_equal(got["__call__"], torch_model(t).detach().numpy())


def test_equinox_mlp_and_sequential_with_lambda() -> None:
    mlp, x = build(eqx.nn.MLP, 3, 2, 4, 2, key=KEY), jnp.arange(3.0)
    with inspector.tail(mlp, path="mlp") as fmodel:
        fmodel(x)
    want, h = {"__call__": mlp(x)}, x
    for i, layer in enumerate(mlp.layers):
        h = want[f"layers.{i}.__call__"] = layer(h)
        h = mlp.activation(h)
    assert_close(inspector.read_from_safetensors("mlp"), want)

    k1, k2 = jax.random.split(KEY)
    seq = build(
        lambda: eqx.nn.Sequential(
            [eqx.nn.Linear(3, 4, key=k1), eqx.nn.Lambda(jax.nn.relu), eqx.nn.Linear(4, 2, key=k2)]
        )
    )
    with inspector.tail(seq, path="seq") as fmodel:
        fmodel(x)
    a = seq.layers[0](x)
    b = jax.nn.relu(a)
    want = {
        "layers.0.__call__": a,
        "layers.1.__call__": b,
        "layers.2.__call__": seq.layers[2](b),
        "__call__": seq(x),
    }
    assert_close(inspector.read_from_safetensors("seq"), want)


def _attention() -> tuple[Any, jax.Array, jax.Array]:
    mha = build(eqx.nn.MultiheadAttention, num_heads=2, query_size=4, key=KEY)
    return mha, jnp.linspace(-1, 1, 12).reshape(3, 4), jnp.linspace(1, -2, 20).reshape(5, 4)


def test_equinox_multihead_attention() -> None:
    mha, q, kv = _attention()
    with inspector.tail(mha, path="run") as fmodel:
        fmodel(q, kv, kv)
    data = inspector.read_from_safetensors("run")
    assert list(data) == [
        "query_proj.__call__", "key_proj.__call__", "value_proj.__call__", "dropout.__call__",
        "output_proj.__call__", "__call__",
    ]  # fmt: skip
    np.testing.assert_allclose(
        data["__call__"], eqx.filter_jit(mha)(q, kv, kv), rtol=1e-5, atol=1e-6
    )


def test_equinox_multihead_attention_projections_equal_eager() -> None:
    # MultiheadAttention calls its projections under its own jax.vmap: each is saved batch
    # axis first, as the eager jax.vmap of the projection returns it.
    mha, q, kv = _attention()
    with inspector.tail(mha, path="run", filter_=lambda p, n: "proj" in p[-1]) as fmodel:
        fmodel(q, kv, kv)
    data = inspector.read_from_safetensors("run")
    want = {
        "query_proj.__call__": jax.vmap(mha.query_proj)(q),
        "key_proj.__call__": jax.vmap(mha.key_proj)(kv),
        "value_proj.__call__": jax.vmap(mha.value_proj)(kv),
        "output_proj.__call__": mha(q, kv, kv),
    }
    assert_close(data, want)


def test_a_filter_that_chooses_only_functions_is_an_error() -> None:
    mlp = build(eqx.nn.MLP, 3, 2, 4, 1, key=KEY)
    with (
        inspector.tail(mlp, path="run", filter_=lambda p, n: p[-1:] == ("activation",)) as fmodel,
        pytest.raises(clouseau.SelectionError, match="activation"),
    ):
        fmodel(jnp.ones(3))


def test_not_a_model_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="PyTorch or JAX"), inspector.tail(3, path="run"):
        pass


def test_two_nested_recorders_inside_one_jit_stay_isolated() -> None:
    a, b = build(Net), build(Net, seed=1)
    x = jnp.arange(3.0)
    with (
        inspector.tail(a, path="a") as fa,
        inspector.tail(b, path="b", filter_=lambda p, n: p[-1:] == ("head",)) as fb,
    ):
        jax.jit(lambda x: fa(x) + fb(x))(x)
    assert_close(inspector.read_from_safetensors("a"), eager(a, x))
    assert_close(
        inspector.read_from_safetensors("b"), {"head.__call__": eager(b, x)["head.__call__"]}
    )
