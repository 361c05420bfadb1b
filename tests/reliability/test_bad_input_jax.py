"""Bad input through the public API, JAX functions and Equinox modules (issue 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import clouseau
from clouseau.ir.errors import ArgumentError, ClouseauError, SelectionError, TraceError
from tests.reliability.jax_models import Stack, mlp, value_branch
from tests.reliability.models import line_of

JAX_MODELS = Path(__file__).with_name("jax_models.py")


@pytest.mark.parametrize("how", ["trace", "instrument"])
def test_value_dependent_if_names_the_line_and_suggests_cond(how: str) -> None:
    x = jnp.ones((2, 4))
    fmodel = clouseau.instrument(value_branch, path=None)
    with pytest.raises(TraceError) as info:
        clouseau.trace(value_branch, x) if how == "trace" else fmodel(x)
    text = str(info.value)
    line = line_of("JAX-BRANCH-LINE", JAX_MODELS)
    assert f"jax_models.py:{line} (value_branch): if y.sum() > 0:" in text
    assert "value-dependent Python control flow" in text
    assert "jax.lax.cond" in text and "jnp.where" in text
    assert fmodel.captured.calls == ()


def test_select_matching_nothing_lists_close_names() -> None:
    fmodel = clouseau.instrument(mlp, select="reluu", path=None)
    with pytest.raises(SelectionError) as info:
        fmodel(jnp.ones((2, 4)))
    text = str(info.value)
    assert "select 'reluu' matched no point of mlp" in text and "closest names: relu" in text
    assert "clouseau.trace(model, *args).names()" in text


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        ("relu[", "unbalanced '[' ']'"),
        (3, "select must be a glob string"),
        (["relu", None], "select must be a glob string"),
    ],
)
def test_invalid_select_fails_at_instrument(select: Any, expected: str) -> None:
    with pytest.raises(SelectionError, match=expected.replace("[", r"\[")):
        clouseau.instrument(mlp, select=select, path=None)


@pytest.mark.parametrize(
    ("model", "args", "head", "expected"),
    [
        (mlp, (jnp.ones((2, 4)), jnp.ones((2, 4))), "mlp(x)", "too many positional arguments"),
        (mlp, (), "mlp(x)", "missing a required argument: 'x'"),
        (Stack(4, 1), (jnp.ones(4), 3), "Stack(x)", "too many positional arguments"),
    ],
)
def test_wrong_number_of_arguments(
    model: Any, args: tuple[Any, ...], head: str, expected: str
) -> None:
    fmodel = clouseau.instrument(model, path=None)
    with pytest.raises(ArgumentError) as info:
        fmodel(*args)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ClouseauError)
    text = str(info.value)
    assert text.startswith(f"{head} cannot take the arguments") and expected in text
    assert "as you would call the model itself" in text


def test_shapes_the_model_rejects_keep_earlier_calls(tmp_path: Path) -> None:
    xs = [np.full((2, 4), 0.5, np.float32), np.full((2, 4), -1.0, np.float32)]
    with clouseau.instrument(mlp, path=tmp_path) as fmodel:
        outs = [np.asarray(fmodel(x)) for x in xs]
        with pytest.raises(TraceError) as info:
            fmodel(jnp.ones((2, 5)))
        # A new shape (and a new dtype) is a new signature: traced again.
        xs.append(np.arange(12, dtype=np.float32).reshape(3, 4))
        outs.append(np.asarray(fmodel(xs[-1])))
        xs.append(np.ones((2, 4), np.int32))
        outs.append(np.asarray(fmodel(xs[-1])))
    text = str(info.value)
    assert "cannot trace mlp: it fails on these inputs (float32[2, 5])" in text
    assert "jax_models.py:" in text and "x @ w" in text
    assert "dot_general requires contracting dimensions" in text
    assert "Fix: pass inputs the model accepts" in text

    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 1, 2, 3) and dict(cap.failed_calls) == {}
    assert len(cap.graphs) == 3
    for call, (x, out) in enumerate(zip(xs, outs, strict=True)):
        assert np.array_equal(out, np.asarray(mlp(x)))
        assert np.array_equal(cap.get("x", call=call), x)
        assert cap.get("x", call=call).dtype == x.dtype
        assert np.array_equal(cap.get("relu", call=call), out)


def nested(x: jax.Array) -> Any:
    y = jnp.sin(x)
    return {"a": (y, None, [y * 2, {"n": 3, "s": "text"}]), "none": None, "i": 7}


def returns_none(x: jax.Array) -> None:
    _ = jnp.sin(x)
    return None


@pytest.mark.parametrize("fn", [nested, returns_none])
def test_outputs_none_nested_and_non_array_equal_the_models(fn: Any) -> None:
    x = jnp.linspace(-1.0, 1.0, 6)
    fmodel = clouseau.instrument(fn, path=None)
    got, expected = fmodel(x), fn(x)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    for a, b in zip(
        jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected), strict=True
    ):
        assert type(a) is type(b) if not isinstance(b, jax.Array) else isinstance(a, jax.Array)
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert np.array_equal(fmodel.captured.get("x", call=0), np.asarray(x))
