"""Points inside cond branches, while bodies and custom_jvp/custom_vjp functions.

Every saved value equals the same value computed by hand (plain Python control flow on
concrete arrays), called directly, under jit, vmap, grad and scan; the model's outputs and
gradients equal the uninstrumented model's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import clouseau
from clouseau.capture import jax as cj
from clouseau.ir.passes import insert_saves
from clouseau.ir.verify import verify

RTOL, ATOL = 1e-5, 1e-6
W = jax.random.normal(jax.random.key(0), (4, 4)) * 0.6
WS = jax.random.normal(jax.random.key(1), (3, 4, 4)) * 0.6
X = jnp.array([0.3, -1.2, 0.8, 0.5])
XS = jnp.stack([X, -X, 2 * X, -0.5 * X])  # both signs of h.sum(): both branches


def positive(h: jax.Array) -> jax.Array:
    return jax.nn.relu(h @ W) * 2


def negative(h: jax.Array) -> jax.Array:
    return jnp.tanh(h) - 1


def cond_model(x: jax.Array) -> jax.Array:
    h = jnp.sin(x)
    return jax.lax.cond(h.sum() > 0, positive, negative, h) * 3


def cond_reference(x: jax.Array) -> dict[str, Any]:
    h = np.sin(np.asarray(x))
    if h.sum() > 0:
        relu = np.maximum(h @ np.asarray(W), 0)
        return {"cond.positive.relu": relu, "cond": relu * 2}
    tanh = np.tanh(h)
    return {"cond.negative.tanh": tanh, "cond": tanh - 1}


def while_model(x: jax.Array) -> jax.Array:
    def keep_going(carry: tuple[jax.Array, jax.Array]) -> jax.Array:
        i, v = carry
        return (jnp.abs(v).sum() > 0.4) & (i < 20)

    def step(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        i, v = carry
        return i + 1, jnp.tanh(v @ W) * 0.7

    return jax.lax.while_loop(keep_going, step, (0, x))[1]


def while_reference(x: jax.Array) -> list[np.ndarray]:
    """The body's tanh of each iteration."""
    i, v, found = 0, np.asarray(x), []
    while np.abs(v).sum() > 0.4 and i < 20:
        tanh = np.tanh(v @ np.asarray(W))
        found.append(tanh)
        i, v = i + 1, (tanh * 0.7).astype(np.float32)
    return found


@jax.custom_jvp
def soft_clip(x: jax.Array) -> jax.Array:
    return jnp.tanh(x) * 2


# Deliberately not the derivative of the body: a rerun that dropped the rule would differ.
soft_clip.defjvp(lambda primals, tangents: (soft_clip(primals[0]), tangents[0] * 0.5))


@jax.custom_vjp
def bent(x: jax.Array) -> jax.Array:
    return jnp.sin(x) + x


bent.defvjp(lambda x: (bent(x), None), lambda _, g: (g * 3,))


def custom_model(x: jax.Array) -> jax.Array:
    return bent(soft_clip(x @ W)) * x


def custom_reference(x: jax.Array) -> dict[str, Any]:
    a = np.asarray(x) @ np.asarray(W)
    clipped = np.tanh(a) * 2
    return {"soft_clip.tanh": np.tanh(a), "soft_clip": clipped, "bent.sin": np.sin(clipped)}


def _values(sink: Any, call: int) -> dict[str, Any]:
    return sink.values(call)


# --- the graph -------------------------------------------------------------------------


def test_points_inside_control_flow_are_named_and_verified() -> None:
    names = cj.trace(cond_model, X).names()
    assert {"cond.positive.relu", "cond.positive.mul", "cond.negative.tanh", "cond"} <= set(names)
    assert {"while.tanh", "while.mul", "while.carry_1", "while:1"} <= set(
        cj.trace(while_model, X).names()
    )
    graph = cj.trace(custom_model, X)
    assert {"soft_clip.tanh", "soft_clip", "bent.sin", "bent"} <= set(graph.names())
    for g in (graph, cj.trace(cond_model, X), cj.trace(while_model, X)):
        verify(insert_saves(g, "*"))


def test_lambda_branches_are_numbered_in_switch_order() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jax.lax.switch(jnp.argmax(x), [jnp.sin, lambda a: a * 2, lambda a: -a], x)

    names = cj.trace(f, X).names()
    assert {"cond.branch1.mul", "cond.branch2.neg"} <= set(names)


def test_library_custom_functions_stay_one_op() -> None:
    graph = cj.trace(lambda x: jax.nn.logsumexp(x) + jax.nn.softplus(x), X)
    assert not [n for n in graph.names() if n.startswith("logsumexp.")]


# --- cond ------------------------------------------------------------------------------


@pytest.mark.parametrize("x", [X, -X], ids=["true-branch", "false-branch"])
@pytest.mark.parametrize("context", ["direct", "jit"])
def test_cond_saves_the_taken_branch_only(x: jax.Array, context: str, sink: Any) -> None:
    fm = cj.instrument(cond_model, select=["cond.*", "cond"], sink=sink)
    out = fm(x) if context == "direct" else jax.jit(fm)(x)
    fm.close()
    np.testing.assert_allclose(out, jax.jit(cond_model)(x), rtol=RTOL, atol=ATOL)
    got, want = _values(sink, 0), cond_reference(x)
    assert {k for k in got if not k.endswith(("mul", "sub", "dot_general"))} == set(want)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL, err_msg=name)


def test_cond_under_vmap_keeps_branches_any_example_took(sink: Any) -> None:
    fm = cj.instrument(cond_model, select=["cond.*.relu", "cond.*.tanh", "cond"], sink=sink)
    out = jax.vmap(fm)(XS)
    fm.close()
    np.testing.assert_allclose(out, jax.jit(jax.vmap(cond_model))(XS), rtol=RTOL, atol=ATOL)
    got = _values(sink, 0)
    assert len(sink.calls) == 1
    for row, x in enumerate(XS):
        for name, ref in cond_reference(x).items():
            np.testing.assert_allclose(got[name][row], ref, rtol=RTOL, atol=ATOL, err_msg=name)


def test_cond_under_grad_and_scan(sink: Any) -> None:
    fm = cj.instrument(cond_model, select=["cond.*.relu", "cond.*.tanh"], sink=sink)
    for x in (X, -X):
        got = jax.grad(lambda a: fm(a).sum())(x)
        want = jax.jit(jax.grad(lambda a: cond_model(a).sum()))(x)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    jax.lax.scan(lambda c, x: (c + fm(x).sum(), None), 0.0, XS)
    fm.close()
    assert len(sink.calls) == 2 + len(XS)
    for call, x in enumerate([X, -X, *XS]):
        want = {k: v for k, v in cond_reference(x).items() if k != "cond"}
        got = _values(sink, call)
        assert set(got) == set(want)
        for name, ref in want.items():
            np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL, err_msg=name)


def test_intervention_inside_the_taken_branch(sink: Any) -> None:
    fm = cj.instrument(
        cond_model, select=None, intervene={"cond.positive.relu": clouseau.zero()}, sink=sink
    )
    with fm:
        np.testing.assert_allclose(fm(X), np.zeros(4), atol=ATOL)
        np.testing.assert_allclose(fm(-X), jax.jit(cond_model)(-X), rtol=RTOL, atol=ATOL)


# --- while -----------------------------------------------------------------------------


def _check_while(got: dict[str, Any], x: jax.Array) -> None:
    want = while_reference(x)
    assert len(want) >= 2
    assert sorted(got["while.tanh"]) == [(i,) for i in range(len(want))]
    for i, ref in enumerate(want):
        np.testing.assert_allclose(got["while.tanh"][(i,)], ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("context", ["direct", "jit", "scan"])
def test_while_body_is_saved_every_iteration(context: str, sink: Any) -> None:
    fm = cj.instrument(while_model, select=["while.tanh", "while:1"], sink=sink)
    xs = [X, 2 * X]
    if context == "scan":
        outs = jax.lax.scan(lambda c, x: (c, fm(x)), 0.0, jnp.stack(xs))[1]
    else:
        call = fm if context == "direct" else jax.jit(fm)
        outs = [call(x) for x in xs]
    fm.close()
    assert sink.ended == [0, 1] and not sink.failed
    for call, (x, out) in enumerate(zip(xs, outs, strict=True)):
        np.testing.assert_allclose(out, jax.jit(while_model)(x), rtol=RTOL, atol=ATOL)
        got = _values(sink, call)
        _check_while(got, x)
        np.testing.assert_allclose(got["while:1"], out, rtol=RTOL, atol=ATOL)


def test_while_under_vmap_is_one_call_with_the_batch_axis(sink: Any) -> None:
    fm = cj.instrument(while_model, select="while.tanh", sink=sink)
    xs = jnp.stack([X, 3 * X])
    out = jax.vmap(fm)(xs)
    fm.close()
    np.testing.assert_allclose(out, jax.jit(jax.vmap(while_model))(xs), rtol=RTOL, atol=ATOL)
    assert len(sink.calls) == 1
    got = _values(sink, 0)["while.tanh"]
    for row, x in enumerate(xs):
        # An example still looping at iteration i has its own value there.
        for i, ref in enumerate(while_reference(x)):
            np.testing.assert_allclose(got[(i,)][row], ref, rtol=RTOL, atol=ATOL)


def test_while_inside_scan_is_indexed_by_both_loops(sink: Any) -> None:
    def model(x: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda v, _: (while_model(v) + 1.5, None), x, length=3)[0]

    fm = cj.instrument(model, select="scan.while.tanh", sink=sink)
    out = fm(X)
    fm.close()
    np.testing.assert_allclose(out, jax.jit(model)(X), rtol=RTOL, atol=ATOL)
    got = _values(sink, 0)["scan.while.tanh"]
    v = X
    for step in range(3):
        for i, ref in enumerate(while_reference(v)):
            np.testing.assert_allclose(got.pop((step, i)), ref, rtol=RTOL, atol=ATOL)
        v = jax.jit(while_model)(v) + 1.5
    assert not got


def test_cond_inside_scan_inside_while(sink: Any) -> None:
    def model(x: jax.Array, ws: jax.Array) -> jax.Array:
        def layer(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
            h = jax.lax.cond(w[0, 0] > 0, lambda a: jax.nn.relu(a @ w), lambda a: a * 0.5, h)
            return h, None

        def step(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            return carry[0] + 1, jax.lax.scan(layer, carry[1], ws)[0]

        return jax.lax.while_loop(lambda c: c[0] < 2, step, (0, x))[1]

    fm = cj.instrument(model, select="while.scan.cond.*.relu", sink=sink)
    out = fm(X, WS)
    fm.close()
    np.testing.assert_allclose(out, jax.jit(model)(X, WS), rtol=RTOL, atol=ATOL)
    (name,) = _values(sink, 0)
    got = _values(sink, 0)[name]
    h, want = np.asarray(X), {}
    for i in range(2):
        for layer, w in enumerate(np.asarray(WS)):
            if w[0, 0] > 0:
                h = np.maximum(h @ w, 0)
                want[(i, layer)] = h
            else:
                h = h * 0.5
    assert 0 < len(want) < 6 and sorted(got) == sorted(want)
    for index, ref in want.items():
        np.testing.assert_allclose(got[index], ref, rtol=RTOL, atol=ATOL)


# --- custom_jvp / custom_vjp -----------------------------------------------------------


@pytest.mark.parametrize("context", ["direct", "jit", "vmap"])
def test_custom_functions_save_their_insides(context: str, sink: Any) -> None:
    fm = cj.instrument(custom_model, select=["soft_clip", "soft_clip.*", "bent.sin"], sink=sink)
    if context == "vmap":
        out = jax.vmap(fm)(XS)
        want_out = jax.jit(jax.vmap(custom_model))(XS)
    else:
        out = (fm if context == "direct" else jax.jit(fm))(X)
        want_out = jax.jit(custom_model)(X)
    fm.close()
    np.testing.assert_allclose(out, want_out, rtol=RTOL, atol=ATOL)
    got = _values(sink, 0)
    rows = list(XS) if context == "vmap" else [X]
    for row, x in enumerate(rows):
        for name, ref in custom_reference(x).items():
            value = got[name][row] if context == "vmap" else got[name]
            np.testing.assert_allclose(value, ref, rtol=RTOL, atol=ATOL, err_msg=name)


def test_custom_derivative_rules_are_kept_under_grad(sink: Any) -> None:
    fm = cj.instrument(custom_model, select=["soft_clip.tanh", "bent"], sink=sink)
    got = jax.jit(jax.grad(lambda x: fm(x).sum()))(X)
    want = jax.jit(jax.grad(lambda x: custom_model(x).sum()))(X)

    def body_only(x: jax.Array) -> jax.Array:
        clipped = jnp.tanh(x @ W) * 2
        return ((jnp.sin(clipped) + clipped) * x).sum()

    assert not np.allclose(want, jax.grad(body_only)(X), rtol=0.01)  # the rules matter here
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    fm.close()
    assert len(sink.calls) == 1
    np.testing.assert_allclose(
        _values(sink, 0)["soft_clip.tanh"], custom_reference(X)["soft_clip.tanh"], rtol=RTOL
    )
