"""Stateful models compute exactly what they compute uninstrumented.

Flax NNX (BatchNorm statistics, ``nnx.Rngs`` advancing, Dropout drawing a new mask per
call) directly and under ``nnx.jit``, ``nnx.scan`` and ``nnx.vmap``; Equinox ``BatchNorm``
with ``eqx.nn.State``; Flax Linen ``apply(..., mutable=[...])``. State that a trace cannot
carry is refused at trace time, naming the attribute.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import flax.linen as linen
import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clouseau.capture import jax as cj
from clouseau.ir.errors import TraceError

RTOL, ATOL = 1e-5, 1e-6
X = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))


class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.head = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.drop(nnx.relu(self.bn(self.conv(x))))
        return self.head(h.mean((1, 2)))


def _cnn() -> CNN:
    return CNN(nnx.Rngs(0, dropout=1))


def _state(model: Any) -> list[np.ndarray]:
    leaves = jax.tree_util.tree_leaves(nnx.state(model))
    return [np.asarray(jax.random.key_data(x) if _is_key(x) else x) for x in leaves]


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _same_state(plain: Any, instrumented: Any) -> None:
    for a, b in zip(_state(plain), _state(instrumented), strict=True):
        if np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(a, b)  # RNG keys and counts: exactly


def _step(model: Any, x: jax.Array) -> jax.Array:
    return model(x)


@pytest.mark.parametrize("context", ["direct", "nnx.jit"])
def test_nnx_train_mode_state_as_the_plain_module(context: str, sink: Any) -> None:
    plain, model = _cnn(), _cnn()
    fm = cj.instrument(model, select=["bn", "drop", "drop.bernoulli"], sink=sink)
    call = nnx.jit(_step) if context == "nnx.jit" else _step
    masks = []
    with fm:
        for _ in range(5):
            want = call(plain, X)
            np.testing.assert_allclose(call(fm, X), want, rtol=RTOL, atol=ATOL)
            _same_state(plain, model)
    assert plain.drop.rngs.count[...] == model.drop.rngs.count[...] == 5
    assert float(jnp.abs(model.bn.mean[...]).sum()) > 0
    for index in range(5):
        got = sink.values(index)
        masks.append(got["drop.bernoulli"])
        # The dropout mask saved is the one the call used: its output is 0 or bn / (1-p).
        kept = np.maximum(got["bn"], 0) / 0.5
        np.testing.assert_allclose(got["drop"], np.where(masks[-1], kept, 0), rtol=RTOL)
    assert not all(np.array_equal(masks[0], m) for m in masks[1:])  # a new mask per call


def test_nnx_names_are_attribute_paths_and_state_reads_are_points() -> None:
    names = set(cj.trace(_cnn(), X).names())
    assert {"conv", "bn", "drop", "head", "relu", "drop.bernoulli"} <= names
    assert not {n for n in names if n.startswith(("bn.mean", "drop.rngs.count"))}


def test_nnx_nothing_selected_keeps_state(sink: Any) -> None:
    plain, model = _cnn(), _cnn()
    fm = cj.instrument(model, select=None, sink=sink)
    for _ in range(3):
        np.testing.assert_allclose(fm(X), plain(X), rtol=RTOL, atol=ATOL)
        _same_state(plain, model)


class NNXGRU(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.cell = nnx.GRUCell(3, 4, rngs=rngs)

    def __call__(self, xs: jax.Array) -> jax.Array:
        def step(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            h, y = self.cell(h, x)
            return h, y

        return jax.lax.scan(step, jnp.zeros((4,)), xs)[1]


def test_nnx_gru_per_step_equals_a_hand_unrolled_loop(sink: Any) -> None:
    model = NNXGRU(nnx.Rngs(0))
    xs = jax.random.normal(jax.random.key(5), (4, 3))
    fm = cj.instrument(model, select=["scan.carry", "cell:0"], sink=sink)
    with fm:
        np.testing.assert_allclose(fm(xs), nnx.jit(_step)(model, xs), rtol=RTOL, atol=ATOL)
    got, h = sink.values(0), jnp.zeros((4,))
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got["scan.carry"][(i,)], h, rtol=RTOL, atol=ATOL)
        h, _ = model.cell(h, x)
        np.testing.assert_allclose(got["cell:0"][(i,)], h, rtol=RTOL, atol=ATOL)


class Counting(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.head = nnx.Linear(3, 3, rngs=rngs)
        self.calls = 0

    def __call__(self, x: jax.Array) -> jax.Array:
        self.calls += 1  # Python state: a trace runs this once, not once per call
        return self.head(x)


class Outer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.inner = Counting(rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.inner(x) * 2


@pytest.mark.parametrize(("model", "attribute"), [(Counting, "calls"), (Outer, "inner.calls")])
def test_python_side_state_is_refused_naming_the_attribute(
    model: type, attribute: str, sink: Any
) -> None:
    with pytest.raises(TraceError, match=rf"'{attribute}'.*nnx\.Variable"):
        cj.trace(model(nnx.Rngs(0)), jnp.ones((2, 3)))
    fm = cj.instrument(model(nnx.Rngs(0)), select="*", sink=sink)
    with pytest.raises(TraceError, match=attribute):
        fm(jnp.ones((2, 3)))


class EqxNet(eqx.Module):
    linear: eqx.nn.Linear
    bn: eqx.nn.BatchNorm

    def __init__(self, key: jax.Array) -> None:
        self.linear = eqx.nn.Linear(3, 4, key=key)
        self.bn = eqx.nn.BatchNorm(4, axis_name="batch", mode="ema")

    def __call__(self, x: jax.Array, state: eqx.nn.State) -> tuple[jax.Array, eqx.nn.State]:
        h, state = self.bn(self.linear(x), state)
        return jax.nn.relu(h), state


def test_equinox_batchnorm_state_as_the_plain_module(sink: Any) -> None:
    model, state = eqx.nn.make_with_state(EqxNet)(jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (8, 3))
    fm = cj.instrument(model, select=["bn:0", "relu"], sink=sink)
    axes = {"axis_name": "batch", "in_axes": (0, None), "out_axes": (0, None)}
    plain = eqx.filter_jit(jax.vmap(model, **axes))
    instrumented = jax.vmap(fm, **axes)
    s_plain = s_fm = state
    with fm:
        for _ in range(5):
            y_plain, s_plain = plain(x, s_plain)
            y_fm, s_fm = instrumented(x, s_fm)
            np.testing.assert_allclose(y_fm, y_plain, rtol=RTOL, atol=ATOL)
            for a, b in zip(
                jax.tree_util.tree_leaves(s_plain), jax.tree_util.tree_leaves(s_fm), strict=True
            ):
                np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    for index in range(5):
        np.testing.assert_allclose(
            sink.values(index)["relu"], np.maximum(sink.values(index)["bn:0"], 0)
        )


class LinenNet(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = linen.BatchNorm(use_running_average=not train)(linen.Dense(4)(x))
        return linen.relu(linen.Dropout(0.5, deterministic=not train)(x))


def test_linen_apply_with_mutable_collections(sink: Any) -> None:
    net, x = LinenNet(), jax.random.normal(jax.random.key(3), (4, 3))
    variables = net.init(jax.random.key(4), x, train=False)

    def step(variables: Any, x: jax.Array, key: jax.Array) -> Any:
        return net.apply(variables, x, train=True, mutable=["batch_stats"], rngs={"dropout": key})

    fm = cj.instrument(step, select=["*BatchNorm_0.add_3", "*relu"], sink=sink)
    with fm:
        for i in range(3):
            key = jax.random.key(10 + i)
            (y, updates), (y_fm, updates_fm) = (
                jax.jit(step)(variables, x, key),
                fm(variables, x, key),
            )
            np.testing.assert_allclose(y_fm, y, rtol=RTOL, atol=ATOL)
            for a, b in zip(
                jax.tree_util.tree_leaves(updates),
                jax.tree_util.tree_leaves(updates_fm),
                strict=True,
            ):
                np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
            variables = {**variables, **updates}
            np.testing.assert_allclose(sink.values(i)[_only(sink.values(i), "relu")], y_fm)


def _only(values: dict[str, Any], suffix: str) -> str:
    (name,) = [n for n in values if n.endswith(suffix)]
    return name


class Small(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(4, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.drop(nnx.relu(self.bn(self.linear(x))))


def test_nnx_state_under_nnx_scan(sink: Any) -> None:
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
    def steps(model: Any, x: jax.Array) -> tuple[Any, jax.Array]:
        return model, model(x)

    xs = jax.random.normal(jax.random.key(6), (3, 8, 4))
    plain, model = Small(nnx.Rngs(0, dropout=1)), Small(nnx.Rngs(0, dropout=1))
    fm = cj.instrument(model, select=["bn", "drop"], sink=sink)
    with fm:
        _, want = steps(plain, xs)
        _, got = steps(fm, xs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    _same_state(plain, model)
    assert len(sink.calls) == 3 and model.drop.rngs.count[...] == 3


class Counter(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(4, 4, rngs=rngs)
        self.count = nnx.Variable(jnp.array(0))

    def __call__(self, x: jax.Array) -> jax.Array:
        self.count[...] += 1
        return nnx.gelu(self.linear(x)) * self.count[...]


def test_nnx_state_under_nnx_vmap(sink: Any) -> None:
    @nnx.vmap(in_axes=(None, 0), out_axes=0)
    def batched(model: Any, x: jax.Array) -> jax.Array:
        return model(x)

    xs = jax.random.normal(jax.random.key(7), (3, 8, 4))
    plain, model = Counter(nnx.Rngs(0)), Counter(nnx.Rngs(0))
    fm = cj.instrument(model, select=["linear", "gelu"], sink=sink)
    with fm:
        for _ in range(2):
            np.testing.assert_allclose(batched(fm, xs), batched(plain, xs), rtol=RTOL, atol=ATOL)
            assert model.count[...] == plain.count[...]
    got = sink.values(1)
    np.testing.assert_allclose(got["gelu"], jax.nn.gelu(got["linear"]), rtol=RTOL, atol=ATOL)
    assert got["gelu"].shape == (3, 8, 4)


class Shared(nnx.Module):
    def __init__(self) -> None:
        self.first = Counter(nnx.Rngs(0))
        self.second = self.first  # one module at two paths

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.first(x) + self.second(x)


def test_state_shared_between_two_paths_is_refused() -> None:
    with pytest.raises(TraceError, match=r"'first.count'.*also holds as 'second.count'"):
        cj.trace(Shared(), jnp.ones((2, 4)))


def test_nnx_train_and_eval_modes_are_traced_apart(sink: Any) -> None:
    plain, model = _cnn(), _cnn()
    fm = cj.instrument(model, select=["drop"], sink=sink)
    with fm:
        for mode in ("train", "eval", "train"):
            getattr(plain, mode)()
            getattr(model, mode)()
            np.testing.assert_allclose(fm(X), plain(X), rtol=RTOL, atol=ATOL)
            _same_state(plain, model)
    assert len(sink.graphs) == 2  # one trace per mode
    assert model.drop.rngs.count[...] == 2  # eval mode draws no mask
