"""The per-call path of an instrumented module: cached argument plans, direct attributes,
hooks and the trace lock (the fast path must keep every behaviour of the slow one)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from clouseau.capture import torch as ct
from clouseau.capture.torch._sync import TRACE_LOCK
from clouseau.capture.torch.tracing.traced import InputPicker
from tests.conftest import RecordingSink
from tests.torch.conftest import assert_same


class Mixed(nn.Module):
    """Positional, keyword and keyword-only tensors, one with a tensor default."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        bias: torch.Tensor = torch.ones(4),  # noqa: B008 - a tensor default is the point
        scale: float = 1.0,
    ) -> torch.Tensor:
        h = self.block(self.lin(x)) + bias
        if y is not None:
            h = h * y
        return h * scale


def test_input_plans_follow_positions_keywords_and_defaults() -> None:
    default = torch.zeros(1)

    def forward(x, y, *, bias=default, scale=1.0):  # type: ignore[no-untyped-def]
        return x

    picker = InputPicker(inspect.signature(forward), ("x", "y", "bias"))
    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    assert picker((a, b), {}) == (a, b, default)
    got = picker((), {"y": b, "x": a, "bias": c})
    assert got[0] is a and got[1] is b and got[2] is c
    assert picker((a,), {"y": b})[1] is b
    only = InputPicker(inspect.signature(forward), ("x", "y"))
    args = (a, b)
    assert only(args, {}) is args  # the common call hands its tuple over as is
    with pytest.raises(TypeError, match="missing a required argument"):
        only((a,), {})


def test_every_call_shape_gets_the_right_inputs() -> None:
    model = Mixed().eval()
    sink = RecordingSink()
    fm = ct.instrument(model, select="*", sink=sink)
    x, y, bias = torch.randn(2, 4), torch.randn(2, 4), torch.randn(4)
    calls = [
        ((x,), {}),
        ((x, y), {}),
        ((x,), {"y": y}),
        ((), {"y": y, "x": x}),
        ((x, y), {"bias": bias}),
        ((x,), {"bias": bias, "y": y, "scale": 3.0}),
    ]
    for _ in range(2):  # the second round runs from the cache
        for args, kwargs in calls:
            assert_same(fm(*args, **kwargs), model(*args, **kwargs))
            assert_same(sink.values()["lin"], model.lin(x))


def test_users_modules_are_left_as_they_were() -> None:
    model = Mixed().eval()
    before = {name: set(vars(m)) for name, m in model.named_modules()}
    fm = ct.instrument(model, select="*", sink=RecordingSink())
    x = torch.randn(2, 4)
    fm(x)
    fm(x)
    assert {name: set(vars(m)) for name, m in model.named_modules()} == before
    # A hook added after the graph was lowered still fires: the graph calls the modules.
    seen: list[str] = []
    model.block[0].register_forward_hook(lambda *_: seen.append("inner"))
    fm.register_forward_hook(lambda *_: seen.append("outer"))
    assert_same(fm(x), model(x))
    assert seen == ["inner", "outer", "inner"]


def test_weights_changed_in_place_are_seen(sink: RecordingSink) -> None:
    model = Mixed().eval()
    fm = ct.instrument(model, select=None, sink=sink)
    x = torch.randn(2, 4)
    fm(x)
    with torch.no_grad():
        model.lin.weight.mul_(2.0)
    assert_same(fm(x), model(x))


class Flaky(nn.Module):
    """Raises when told to, at run time (traced as a leaf, so the trace cannot see it)."""

    fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise ValueError("boom")
        return x * 2


def test_the_trace_lock_is_released_after_every_call() -> None:
    ct.mark_leaf(Flaky)
    for select in (None, "*"):
        flaky = Flaky()
        sink = RecordingSink()
        fm = ct.instrument(nn.Sequential(nn.Linear(3, 3), flaky), select=select, sink=sink)
        fm(torch.randn(2, 3))
        with pytest.raises(RuntimeError):
            # A new structure (dtype) whose trace fails; a new shape is no new trace.
            fm(torch.randn(2, 3, dtype=torch.float64))
        flaky.fail = True
        with pytest.raises(ValueError, match="boom"):
            fm(torch.randn(2, 3))  # a cached signature whose run fails
        assert sink.status == ([] if select is None else ["end", "fail"])
        assert TRACE_LOCK._readers == 0 and TRACE_LOCK._writer is None
        assert TRACE_LOCK._mine() == 0
