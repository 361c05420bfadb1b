"""The tier sequence (``capture/torch/tiers.py``), driven alone and through real models.

The decisions are plain functions of plain facts; each is checked on its own, then on the
models whose calls take each tier (the tier a model uses is read from its graphs).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import clouseau
from clouseau.capture.torch import tiers
from clouseau.capture.torch.tiers import SEQUENCE, Tier
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
