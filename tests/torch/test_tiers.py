"""The tier sequence (``capture/torch/runtime/tiers.py``), driven alone and through real models.

The decisions are plain functions of plain facts; each is checked on its own, then on the
models whose calls take each tier (the tier a model uses is read from its graphs).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture.torch.runtime import tiers
from clouseau.capture.torch.runtime.tiers import SEQUENCE, Tier
from clouseau.ir.graph import TraceKind
from tests.torch import dynamic_models as dm


def test_every_tier_is_one_step_and_failures_lead_forward() -> None:
    assert [step.tier for step in SEQUENCE] == list(Tier)
    order = [step.tier for step in SEQUENCE]
    for step in SEQUENCE:
        if step.on_failure is not None:  # a failure never leads back
            assert order.index(step.on_failure) > order.index(step.tier)
        assert tiers.on_failure(step.tier) is step.on_failure


def test_the_decisions() -> None:
    assert tiers.first_tier(module_outputs_only=True, plain=True) is Tier.HOOKS
    assert tiers.first_tier(module_outputs_only=True, plain=False) is Tier.FX
    assert tiers.first_tier(module_outputs_only=False, plain=True) is Tier.FX
    assert tiers.export_tier(structure_seen=False) is Tier.EXPORT
    assert tiers.export_tier(structure_seen=True) is Tier.EXPORT_DYNAMIC
    assert tiers.after_untraceable(grads=False) is Tier.DYNAMO
    assert tiers.after_untraceable(grads=True) is None
    # Module outputs only, past both tracers: hooks save all of it, no TorchDynamo.
    assert tiers.after_untraceable(grads=False, module_outputs_only=True) is Tier.HOOKS
    assert tiers.after_untraceable(grads=True, module_outputs_only=True) is None
    assert tiers.after_dynamic_call(dynamo_failed=False) is Tier.DYNAMO
    assert tiers.after_dynamic_call(dynamo_failed=True) is Tier.HOOK_FALLBACK
    assert {t for t in Tier if t.traced} == {Tier.FX, Tier.EXPORT, Tier.EXPORT_DYNAMIC}


class _Branch(torch.nn.Module):
    """torch.fx fails on the branch; torch.export takes it (a shape is no tensor value)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * 2 if y.shape[0] > 1 else y


def _kinds(fmodel: clouseau.InstrumentedModule) -> set[TraceKind]:
    return {g.trace_kind for g in fmodel.captured.graphs}


@pytest.mark.parametrize(
    ("model", "select", "kind"),
    [
        (
            torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4))),
            "0.0",
            TraceKind.TORCH_HOOKS,
        ),
        (torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), "*", TraceKind.TORCH_FX),
        (_Branch(), "*", TraceKind.TORCH_EXPORT),
    ],
    ids=["hooks", "fx", "export"],
)
def test_each_tier_as_the_sequence_says(
    model: torch.nn.Module, select: str, kind: TraceKind
) -> None:
    fmodel = clouseau.instrument(model, select=select, path=None)
    with torch.no_grad():
        for batch in (2, 3):
            fmodel(torch.randn(batch, 4))
    assert _kinds(fmodel) == {kind}
    assert fmodel.captured.calls == (0, 1)


def test_untraceable_takes_the_dynamic_tier_and_gradients_refuse_it() -> None:
    fmodel = clouseau.instrument(dm.IfMean(), select="*", path=None)
    with pytest.warns(UserWarning, match=Tier.DYNAMO.value.replace("(", r"\(").replace(")", r"\)")):
        fmodel(torch.randn(3, 6))
    assert _kinds(fmodel) == {TraceKind.TORCH_DYNAMO}
    fgrads = clouseau.instrument(dm.IfMean(), select="*", path=None, grads=True)
    with pytest.raises(clouseau.TraceError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fgrads(torch.randn(3, 6, requires_grad=True))


def _early_exit_calls(fmodel: clouseau.InstrumentedModule) -> list[bool]:
    """Run calls that exit early and calls that do not; whether each ran ``second``."""
    ran = []
    for scale in (10.0, 0.1, 10.0, 0.1):
        x = torch.full((2, 6), scale)
        model = fmodel.model
        inner = model[0] if isinstance(model, torch.nn.Sequential) else model
        first = torch.relu(inner.first(x))
        ran.append(not bool(first.abs().max() > 1.5))
        with torch.no_grad():
            fmodel(x)
    return ran


@pytest.mark.parametrize(
    ("wrap", "select", "tier"),
    [
        (False, ["second*"], Tier.DYNAMO),  # a wildcard: maybe ops too
        (False, ["second"], Tier.HOOKS),  # past both tracers, module outputs only
        (True, ["0.second"], Tier.HOOKS),
    ],
    ids=["dynamic", "untraceable-hooks", "hooks"],
)
def test_a_call_that_saves_nothing_warns_once(wrap: bool, select: list[str], tier: Tier) -> None:
    torch.manual_seed(0)
    model: torch.nn.Module = dm.EarlyExit()
    model = torch.nn.Sequential(model) if wrap else model
    fmodel = clouseau.instrument(model, select=select, path=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ran = _early_exit_calls(fmodel)
    assert ran == [False, True, False, True]
    empty = [str(w.message) for w in caught if "saved nothing" in str(w.message)]
    assert len(empty) == 1  # once per instrumented model, though two calls saved nothing
    assert repr(select) in empty[0] and f"in the {tier.value} tier" in empty[0]
    cap = fmodel.captured
    # A call that saved nothing holds no record: only the calls that ran it are listed.
    assert cap.calls == tuple(c for c, did in enumerate(ran) if did)
    assert [cap.get(select[0].rstrip("*"), call=c) is not None for c in range(4)] == ran


def test_a_glob_that_matches_some_calls_points_only_is_no_warning() -> None:
    torch.manual_seed(0)
    model = dm.EarlyExit()
    fmodel = clouseau.instrument(model, select=["first", "second"], path=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ran = _early_exit_calls(fmodel)
    assert not [w for w in caught if "saved nothing" in str(w.message)]
    cap = fmodel.captured
    # Each call holds the points it ran: "first" always, "second" where it did not exit.
    assert cap.calls == (0, 1, 2, 3)
    assert all(cap.get("first", call=c) is not None for c in cap.calls)
    assert [cap.get("second", call=c) is not None for c in cap.calls] == ran
    x = torch.full((2, 6), 0.1)
    with torch.no_grad():
        np.testing.assert_array_equal(
            cap.get("second", call=1), model.second(torch.relu(model.first(x))).numpy()
        )
