"""The first call of a signature runs the forward once, interventions and gradients too."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import clouseau
from clouseau.capture import torch as ct
from tests.torch.test_real_names import WithSideEffects

CASES = {
    "plain": {},
    "intervene": {"intervene": {"fc": clouseau.scale(2.0)}},
    "grads": {"grads": True},
    "intervene+grads": {"intervene": {"bn": clouseau.scale(-1.0)}, "grads": True},
}


def _eager(model: torch.nn.Module, options: dict[str, Any]) -> list[Any]:
    """The intervention as a forward hook that changes the module's output."""
    handles = []
    for path, action in options.get("intervene", {}).items():
        k = dict(action.args)["k"]
        module = model.get_submodule(path)
        handles.append(module.register_forward_hook(lambda m, a, out, k=k: out * k))
    return handles


@pytest.mark.parametrize("case", list(CASES))
def test_the_first_call_runs_the_forward_once(case: str) -> None:
    options = CASES[case]
    model, reference = WithSideEffects(), WithSideEffects()
    reference.load_state_dict(model.state_dict())
    ct.mark_leaf(model.count, reference.count)
    _eager(reference, options)
    hooked: list[int] = []
    model.fc.register_forward_hook(lambda *_: hooked.append(1))
    x = torch.randn(3, 4)
    torch.manual_seed(1)
    expected, grads = [], []
    for _ in range(2):  # training: dropout, BatchNorm statistics
        out = reference(x)
        expected.append(out.detach())
        if options.get("grads"):
            grads.append(torch.autograd.grad(out.sum(), out)[0])
    rng_after = torch.rand(1)
    fmodel = clouseau.instrument(model, select="*", path=None, **options)
    torch.manual_seed(1)
    for call, want in enumerate(expected):
        out = fmodel(x)
        assert len(hooked) == call + 1 and model.count.calls == call + 1  # once per call
        assert torch.equal(out, want)
        if options.get("grads"):
            out.sum().backward()
    assert torch.equal(torch.rand(1), rng_after)  # the RNG advanced as in two eager calls
    assert torch.equal(model.bn.running_mean, reference.bn.running_mean)
    captured = fmodel.captured
    assert captured.calls == (0, 1)
    for call, want in enumerate(expected):
        assert torch.equal(torch.from_numpy(captured.get("drop", call=call)), want)
        if options.get("grads"):
            assert torch.equal(torch.from_numpy(captured.get("drop.grad", call=call)), grads[call])


@pytest.mark.parametrize("case", list(CASES))
def test_the_first_call_saves_what_later_calls_save(case: str) -> None:
    """The first call (the trace's own run) and a later one (the lowered graph) agree on
    every point, intervened values and gradients included."""
    model = WithSideEffects().eval()
    ct.mark_leaf(model.count)
    fmodel = clouseau.instrument(model, select="*", path=None, **CASES[case])
    x = torch.randn(3, 4)
    outs = [fmodel(x) for _ in range(2)]
    if CASES[case].get("grads"):
        for out in outs:
            out.sum().backward()
    captured = fmodel.captured
    names = captured.names()
    assert ("fc.grad" in names) == bool(CASES[case].get("grads"))
    for name in names:
        first, later = captured.get(name, call=0), captured.get(name, call=1)
        assert first.dtype == later.dtype and (first == later).all(), name
