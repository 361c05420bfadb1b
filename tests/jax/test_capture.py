"""Saved activations equal hand-written references in every context the model runs in."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clouseau.capture import jax as cj
from tests.jax.models import Case, cases

CASES = {c.name: c for c in cases()}
RTOL, ATOL = 1e-5, 1e-5


def _batch(case: Case) -> jax.Array:
    x = case.example
    return jnp.stack([x, 0.5 * x, -x])


def _direct(case: Case, fm: Any) -> tuple[Any, list[Callable[[], dict[str, Any]]]]:
    return case.call(fm, case.example), [lambda: case.reference(case.model, case.example)]


def _jit(case: Case, fm: Any) -> tuple[Any, list[Any]]:
    out = jax.jit(lambda x: case.call(fm, x))(case.example)
    return out, [lambda: case.reference(case.model, case.example)]


def _filter_jit(case: Case, fm: Any) -> tuple[Any, list[Any]]:
    out = eqx.filter_jit(case.call)(fm, case.example)
    return out, [lambda: case.reference(case.model, case.example)]


def _vmap(case: Case, fm: Any) -> tuple[Any, list[Any]]:
    xs = _batch(case)
    out = jax.vmap(lambda x: case.call(fm, x))(xs)
    return out, [lambda: jax.jit(jax.vmap(lambda x: case.reference(case.model, x)))(xs)]


def _scan(case: Case, fm: Any) -> tuple[Any, list[Any]]:
    xs = _batch(case)
    _, out = jax.lax.scan(lambda c, x: (c, case.call(fm, x)), 0.0, xs)
    return out, [lambda i=i: case.reference(case.model, xs[i]) for i in range(len(xs))]


def _checkpoint(case: Case, fm: Any) -> tuple[Any, list[Any]]:
    out = jax.checkpoint(lambda x: case.call(fm, x))(case.example)
    return out, [lambda: case.reference(case.model, case.example)]


CONTEXTS = {
    "direct": _direct,
    "jit": _jit,
    "filter_jit": _filter_jit,
    "vmap": _vmap,
    "scan": _scan,
    "checkpoint": _checkpoint,
}


@functools.cache
def _expected_output(case_name: str, batched: bool) -> Any:
    case = CASES[case_name]
    if batched:
        return jax.jit(jax.vmap(lambda x: case.call(case.model, x)))(_batch(case))
    return jax.jit(lambda x: case.call(case.model, x))(case.example)


def _check_call(sink: Any, call: int, case: Case, expected: dict[str, Any], batched: bool) -> None:
    got = sink.values(call)
    for name, ref in expected.items():
        assert name in got, f"{name} not saved; saved: {sorted(got)}"
        ref = np.asarray(ref)
        if name in case.loops:
            # One value per scan iteration, with the batch axis (if any) in front.
            steps = ref.shape[1] if batched else ref.shape[0]
            assert sorted(got[name]) == [(i,) for i in range(steps)]
            for (i,), value in got[name].items():
                np.testing.assert_allclose(
                    value, ref[:, i] if batched else ref[i], rtol=RTOL, atol=ATOL, err_msg=name
                )
        else:
            np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("case_name", list(CASES))
def test_saved_values_equal_reference(case_name: str, context: str, sink: Any) -> None:
    case = CASES[case_name]
    names = list(case.reference(case.model, case.example))
    fm = cj.instrument(case.model, select=names, sink=sink)
    out, expected = CONTEXTS[context](case, fm)
    fm.close()
    expected_out = _expected_output(case_name, context in ("vmap", "scan"))
    np.testing.assert_allclose(out, expected_out, rtol=1e-6, atol=1e-6)
    assert len(sink.graphs) == 1
    assert len(sink.calls) == len(expected)
    assert sink.ended == list(range(len(expected)))
    for call, reference in enumerate(expected):
        _check_call(sink, call, case, reference(), batched=context == "vmap")


@pytest.mark.parametrize("case_name", list(CASES))
def test_grad_saves_primal_once_and_gradients_match(case_name: str, sink: Any) -> None:
    case = CASES[case_name]
    names = list(case.reference(case.model, case.example))
    fm = cj.instrument(case.model, select=names, sink=sink)

    def loss(model_and_x: tuple[Any, jax.Array]) -> jax.Array:
        model, x = model_and_x
        return (case.call(model, x) ** 2).sum()

    # Differentiate w.r.t. the model's arrays (an Equinox module stays a pytree) and the input.
    grads = eqx.filter_grad(loss)((fm, case.example))
    plain = eqx.filter_jit(eqx.filter_grad(loss))((case.model, case.example))
    got = jax.tree_util.tree_leaves((getattr(grads[0], "model", None), grads[1]))
    want = jax.tree_util.tree_leaves((plain[0] if isinstance(fm, eqx.Module) else None, plain[1]))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    fm.close()
    assert len(sink.calls) == 1
    _check_call(sink, 0, case, case.reference(case.model, case.example), batched=False)


def test_grad_through_checkpoint_saves_once(sink: Any) -> None:
    case = CASES["mlp"]
    fm = cj.instrument(case.model, select="relu*", sink=sink)

    def loss(x: jax.Array) -> jax.Array:
        return (fm(x) ** 2).sum()

    got = jax.jit(jax.grad(jax.checkpoint(loss)))(case.example)
    want = jax.jit(jax.grad(lambda x: (case.model(x) ** 2).sum()))(case.example)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    fm.close()
    assert len(sink.calls) == 1
    reference = case.reference(case.model, case.example)
    _check_call(sink, 0, case, {k: reference[k] for k in ("relu", "relu_1")}, batched=False)


def test_jitted_loop_gives_one_call_per_model_call(sink: Any) -> None:
    case = CASES["mlp"]
    fm = cj.instrument(case.model, select="relu*", sink=sink)

    @jax.jit
    def loop(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, 4, lambda i, h: h + fm(x * i)[:1].sum(), 0.0) + fm(x).sum()

    loop(case.example)
    fm.close()
    assert len(sink.calls) == 5
    for i in range(4):
        ref = case.reference(case.model, case.example * i)
        np.testing.assert_allclose(sink.values(i)["relu"], ref["relu"], rtol=RTOL, atol=ATOL)
    assert sink.closed


def test_nested_vmap_keeps_both_batch_axes(sink: Any) -> None:
    case = CASES["mlp"]
    fm = cj.instrument(case.model, select="layers.1", sink=sink)
    xs = jnp.stack([_batch(case), 2 * _batch(case)])
    with fm:
        jax.vmap(jax.vmap(fm))(xs)
    (value,) = [v for _, v in sink.calls[0]]
    ref = jax.jit(jax.vmap(jax.vmap(lambda x: case.reference(case.model, x)["layers.1"])))(xs)
    np.testing.assert_allclose(value.array, ref, rtol=RTOL, atol=ATOL)


def test_select_none_runs_the_plain_model(sink: Any) -> None:
    case = CASES["mlp"]
    fm = cj.instrument(case.model, select=None, sink=sink)
    np.testing.assert_array_equal(fm(case.example), case.model(case.example))
    assert sink.graphs == [] and sink.calls == []


def test_one_graph_per_input_signature(sink: Any) -> None:
    case = CASES["mlp"]
    fm = cj.instrument(case.model, select="layers.0", sink=sink)
    fm(case.example)
    fm(case.example + 1)
    fm(case.example[None].repeat(2, 0)[0])
    jax.vmap(fm)(_batch(case))
    fm(case.example.astype(jnp.float16))
    fm.close()
    assert len(sink.graphs) == 2
    assert [g for g, _ in sink.calls[-1]] == [1]
