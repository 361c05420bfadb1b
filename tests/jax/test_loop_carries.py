"""Loop carries are points whatever the initial carry: scan, fori_loop, while_loop, RNNs.

Every saved iteration equals the same value computed by a hand-unrolled Python loop;
the instrumented model's outputs equal ``jax.jit`` of the model.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clouseau.capture import jax as cj

RTOL, ATOL = 1e-5, 1e-6
XS = jax.random.normal(jax.random.key(0), (4, 3))


def _iterations(got: dict[str, Any], name: str) -> list[np.ndarray]:
    values = got[name]
    assert sorted(values) == [(i,) for i in range(len(values))], name
    return [values[(i,)] for i in range(len(values))]


def _check(got: dict[str, Any], want: dict[str, list[np.ndarray]]) -> None:
    for name, steps in want.items():
        found = _iterations(got, name)
        assert len(found) == len(steps), name
        for i, (a, b) in enumerate(zip(found, steps, strict=True)):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"{name}[{i}]")


def scan_model(xs: jax.Array) -> jax.Array:
    carry, ys = jax.lax.scan(lambda c, xi: (c * 0.5 + xi, jnp.sin(c)), jnp.zeros(3), xs)
    return ys.sum(0) + carry


def scan_reference(xs: jax.Array) -> dict[str, list[np.ndarray]]:
    c, out = np.zeros(3, np.float32), {"scan.carry": [], "scan.sin": [], "scan.add": []}
    for xi in np.asarray(xs):
        out["scan.carry"].append(c)
        out["scan.sin"].append(np.sin(c))
        c = c * 0.5 + xi
        out["scan.add"].append(c)
    return out


def fori_model(x: jax.Array) -> jax.Array:
    body = lambda i, c: jnp.cos(c) * 2.0 + i  # noqa: E731
    return jax.lax.fori_loop(0, 3, body, jnp.ones(3)) * x


def fori_reference(x: jax.Array) -> dict[str, list[np.ndarray]]:
    c, out = np.ones(3, np.float32), {"scan.carry_1": [], "scan.cos": [], "scan.add_1": []}
    for i in range(3):
        out["scan.carry_1"].append(c)
        out["scan.cos"].append(np.cos(c))
        c = np.cos(c) * 2.0 + i
        out["scan.add_1"].append(c)
    return out


def while_model(x: jax.Array) -> jax.Array:
    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        i, v = carry
        return i + 1, jnp.tanh(v) + 1.0

    return jax.lax.while_loop(lambda c: c[0] < 4, body, (0, jnp.zeros(3)))[1] * x


def while_reference(x: jax.Array) -> dict[str, list[np.ndarray]]:
    v, out = np.zeros(3, np.float32), {"while.carry_1": [], "while.tanh": []}
    for _ in range(4):
        out["while.carry_1"].append(v)
        out["while.tanh"].append(np.tanh(v))
        v = np.tanh(v) + 1.0
    return out


LOOPS = {
    "scan": (scan_model, XS, scan_reference),
    "fori_loop": (fori_model, XS[0], fori_reference),
    "while_loop": (while_model, XS[0], while_reference),
}


@pytest.mark.parametrize("loop", list(LOOPS))
def test_constant_initial_carries_are_points(loop: str) -> None:
    model, x, reference = LOOPS[loop]
    names = set(cj.trace(model, x).names())
    assert set(reference(x)) <= names


@pytest.mark.parametrize("context", ["direct", "jit"])
@pytest.mark.parametrize("loop", list(LOOPS))
def test_every_iteration_equals_a_hand_unrolled_loop(loop: str, context: str, sink: Any) -> None:
    model, x, reference = LOOPS[loop]
    want = reference(x)
    fm = cj.instrument(model, select=list(want), sink=sink)
    out = fm(x) if context == "direct" else jax.jit(fm)(x)
    fm.close()
    np.testing.assert_allclose(out, jax.jit(model)(x), rtol=RTOL, atol=ATOL)
    _check(sink.values(0), want)


class GRU(eqx.Module):
    """Equinox's RNN example: a zero hidden state carried by ``lax.scan``."""

    hidden_size: int
    cell: eqx.nn.GRUCell
    linear: eqx.nn.Linear

    def __init__(self, in_size: int, hidden_size: int, *, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.hidden_size = hidden_size
        self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=k1)
        self.linear = eqx.nn.Linear(hidden_size, 1, key=k2)

    def __call__(self, xs: jax.Array) -> jax.Array:
        hidden = jnp.zeros((self.hidden_size,))

        def f(carry: jax.Array, inp: jax.Array) -> tuple[jax.Array, None]:
            return self.cell(inp, carry), None

        out, _ = jax.lax.scan(f, hidden, xs)
        return self.linear(out)


class LSTM(eqx.Module):
    """An LSTM over a sequence, with a zero (h, c) carry."""

    hidden_size: int
    cell: eqx.nn.LSTMCell

    def __init__(self, in_size: int, hidden_size: int, *, key: jax.Array) -> None:
        self.hidden_size = hidden_size
        self.cell = eqx.nn.LSTMCell(in_size, hidden_size, key=key)

    def __call__(self, xs: jax.Array) -> jax.Array:
        init = (jnp.zeros((self.hidden_size,)), jnp.zeros((self.hidden_size,)))

        def f(carry: Any, inp: jax.Array) -> tuple[Any, jax.Array]:
            h, c = self.cell(inp, carry)
            return (h, c), h

        _, hs = jax.lax.scan(f, init, xs)
        return hs


def test_equinox_gru_hidden_state_per_step(sink: Any) -> None:
    model = GRU(3, 5, key=jax.random.key(1))
    names = cj.trace(model, XS).names()
    assert {"scan.carry", "cell", "cell.dot_general_1"} <= set(names)
    fm = cj.instrument(model, select=["scan.carry", "cell", "cell.dot_general_1"], sink=sink)
    with fm:
        np.testing.assert_allclose(fm(XS), _jitted(model, XS), rtol=RTOL, atol=ATOL)
    hidden, want = jnp.zeros(5), {"scan.carry": [], "cell": [], "cell.dot_general_1": []}
    for x in XS:  # hand-unrolled
        want["scan.carry"].append(np.asarray(hidden))
        want["cell.dot_general_1"].append(np.asarray(model.cell.weight_hh @ hidden))
        hidden = model.cell(x, hidden)
        want["cell"].append(np.asarray(hidden))
    _check(sink.values(0), want)


def test_equinox_lstm_hidden_and_cell_state_per_step(sink: Any) -> None:
    model = LSTM(3, 4, key=jax.random.key(2))
    fm = cj.instrument(model, select=["scan.carry", "scan.carry_1", "cell:0", "cell:1"], sink=sink)
    with fm:
        np.testing.assert_allclose(fm(XS), _jitted(model, XS), rtol=RTOL, atol=ATOL)
    h, c = jnp.zeros(4), jnp.zeros(4)
    want: dict[str, list[np.ndarray]] = {
        "scan.carry": [],
        "scan.carry_1": [],
        "cell:0": [],
        "cell:1": [],
    }
    for x in XS:
        want["scan.carry"].append(np.asarray(h))
        want["scan.carry_1"].append(np.asarray(c))
        h, c = model.cell(x, (h, c))
        want["cell:0"].append(np.asarray(h))
        want["cell:1"].append(np.asarray(c))
    _check(sink.values(0), want)


def _jitted(model: Any, x: jax.Array) -> jax.Array:
    return eqx.filter_jit(lambda m, a: m(a))(model, x)
