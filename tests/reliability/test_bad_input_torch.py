"""Bad input through the public API, PyTorch models (issue 7; docs/errors.md).

Every test checks that the message names the cause and the fix, and, where a call fails,
that what was captured before is intact and the model keeps working.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import clouseau
from clouseau.capture.torch import mark_leaf
from clouseau.ir.errors import ArgumentError, ClouseauError, SelectionError, TraceError
from tests.reliability.models import Small, ValueBranch, line_of


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_untraceable_model_names_model_both_causes_line_and_fix() -> None:
    with pytest.raises(TraceError) as info:
        clouseau.trace(ValueBranch(), torch.randn(2, 4))
    text = str(info.value)
    assert "cannot trace ValueBranch" in text
    assert f"models.py:{line_of('BRANCH-LINE')} (if y.sum() > 0:" in text
    assert "torch.fx failed:" in text and "control flow" in text
    assert "torch.export failed:" in text
    assert "torch.where" in text and "torch.cond" in text and "mark_leaf" in text


def test_untraceable_model_runs_in_the_dynamic_tier_and_mark_leaf_keeps_it_static() -> None:
    # A model that runs eagerly is never refused: fx and export fail, TorchDynamo runs it,
    # and the warning says so and why.
    model = ValueBranch()
    fmodel = clouseau.instrument(model, path=None)
    x = torch.randn(2, 4)
    with pytest.warns(UserWarning, match=r"ValueBranch uses the dynamic \(TorchDynamo\) tier"):
        assert torch.equal(fmodel(x), model(x))
    assert fmodel.captured.calls == (0,)
    assert np.array_equal(fmodel.captured.get("fc", call=0), model.fc(x).detach().numpy())

    # The fix the message gives: the branching module runs untraced as one node.
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.branch = ValueBranch()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.branch(x) * 2

    model = Outer()
    mark_leaf(model.branch)
    x = torch.randn(2, 4)
    fixed = clouseau.instrument(model, select="branch", path=None)
    assert torch.equal(fixed(x), model(x))
    assert np.array_equal(fixed.captured["branch"], model.branch(x).detach().numpy())


def test_select_matching_nothing_lists_close_names() -> None:
    fmodel = clouseau.instrument(Small(), select="reluu", path=None)
    with pytest.raises(SelectionError) as info:
        fmodel(torch.randn(2, 4))
    text = str(info.value)
    assert "select 'reluu' matched no point of Small" in text
    assert "closest names: relu" in text
    assert "clouseau.trace(model, *args).names()" in text


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        ("relu[", "invalid glob 'relu[': unbalanced '[' ']'"),
        ("", "invalid glob '': a glob is a non-empty string"),
        (["fc", "!"], "invalid glob '': a glob is a non-empty string"),
        (3, "select must be a glob string, a list of globs, a callable"),
        (["fc", 3], "select must be a glob string, a list of globs, a callable"),
    ],
)
def test_invalid_select_fails_at_instrument_not_at_first_call(
    select: Any, expected: str, tmp_path: Path
) -> None:
    with pytest.raises(SelectionError) as info:
        clouseau.instrument(Small(), select=select, path=tmp_path / "cap")
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((torch.randn(2, 4), torch.randn(2, 4)), {}, "too many positional arguments"),
        ((), {}, "missing a required argument: 'x'"),
        ((torch.randn(2, 4),), {"y": 1}, "got an unexpected keyword argument 'y'"),
    ],
)
def test_wrong_number_of_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], expected: str
) -> None:
    fmodel = clouseau.instrument(Small(), path=None)
    fmodel(torch.randn(2, 4))
    with pytest.raises(ArgumentError) as info:
        fmodel(*args, **kwargs)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ClouseauError)
    text = str(info.value)
    assert "Small.forward(x) cannot take the arguments" in text and expected in text
    assert "as you would call the model itself" in text
    assert fmodel.captured.calls == (0,)


@pytest.mark.parametrize(
    ("bad", "described", "cause"),
    [
        (torch.ones(2, 4, dtype=torch.float64), "float64[2, 4]", "must have the same dtype"),
        (torch.ones(2, 4, dtype=torch.int64), "int64[2, 4]", "must have the same dtype"),
        ("text", "'text'", "must be Tensor, not str"),
    ],
)
def test_inputs_the_model_rejects_keep_earlier_calls(
    bad: Any, described: str, cause: str, tmp_path: Path
) -> None:
    model = Small()
    xs = [torch.randn(2, 4), torch.randn(2, 4), torch.randn(3, 4)]
    with clouseau.instrument(model, select="*", path=tmp_path) as fmodel:
        assert torch.equal(fmodel(xs[0]), model(xs[0]))
        assert torch.equal(fmodel(xs[1]), model(xs[1]))
        with pytest.raises(TraceError) as info:
            fmodel(bad)
        # A new structure is traced anew; the model keeps working (a new shape: no trace).
        assert torch.equal(fmodel(xs[2]), model(xs[2]))
    text = str(info.value)
    line = line_of("return self.fc2(self.act(self.fc(x)))")
    assert f"cannot trace Small: it fails on these inputs ({described}) at " in text
    assert f"models.py:{line} (return self.fc2(self.act(self.fc(x))))" in text
    assert cause in text
    assert "torch.fx traced it, but running it failed" in text
    assert "Fix: pass inputs the model accepts" in text

    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 1, 2) and dict(cap.failed_calls) == {}
    assert len(cap.graphs) == 1  # (2, 4) serves (3, 4); the failed trace added none
    for call, x in enumerate(xs):
        with torch.no_grad():
            hidden = model.fc(x)
            assert np.array_equal(cap.get("x", call=call), x.numpy())
            assert np.array_equal(cap.get("fc", call=call), hidden.numpy())
            assert np.array_equal(cap.get("fc2", call=call), model(x).numpy())


def test_a_shape_the_model_cannot_take_fails_with_its_own_error(tmp_path: Path) -> None:
    # Same structure, another shape: no trace; the model's own error, the call failed.
    model = Small()
    with clouseau.instrument(model, select="*", path=tmp_path) as fmodel:
        fmodel(torch.randn(2, 4))
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            fmodel(torch.ones(2, 5))
        fmodel(torch.randn(3, 4))
    cap = clouseau.load(tmp_path)
    assert list(cap.failed_calls) == [1] and "cannot be multiplied" in cap.failed_calls[1]
    assert cap.calls == (0, 2) and len(cap.graphs) == 1


class NestedOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.fc(x)
        z = y.relu()
        return {"a": (y, None, [z, {"n": 3, "s": "text", "f": 0.5}]), "none": None, "i": 7}


class ReturnsNone(nn.Module):
    def forward(self, x: torch.Tensor) -> None:
        self.last = None
        _ = x + 1
        return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("model_type", [NestedOutputs, ReturnsNone])
def test_outputs_none_nested_and_non_tensor_equal_the_models(model_type: type) -> None:
    model = model_type()
    x = torch.randn(2, 3)
    fmodel = clouseau.instrument(model, path=None)
    expected = model(x)
    got = fmodel(x)
    assert _same(got, expected), (got, expected)
    assert fmodel.captured.calls == (0,)
    assert np.array_equal(fmodel.captured["x"], x.numpy())
