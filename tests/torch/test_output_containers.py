"""The instrumented model returns the user's own output container: its type, its keys in
order and its values, on the traced path (torch.fx writes every mapping as a ``dict``)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch import nn

import clouseau
from clouseau.ir.graph import TraceKind
from tests.models.helpers import tensors_of

TIERS = {"fx": TraceKind.TORCH_FX, "export": TraceKind.TORCH_EXPORT}


class Pair(NamedTuple):
    low: torch.Tensor
    high: torch.Tensor


@dataclass
class Heads:
    logits: torch.Tensor
    extra: OrderedDict[str, torch.Tensor]


class Containers(nn.Module):
    """One model per container kind (``kind``), each with a module inside."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.fc(x)
        if self.kind == "ordered":  # torchvision's segmentation models
            out = OrderedDict()
            out["out"] = y.relu()
            out["aux"] = [y * 2, {"z": y - 1}]
            return out
        if self.kind == "reversed":  # keys not in sorted order
            return OrderedDict([("z", y), ("a", y + 1)])
        if self.kind == "namedtuple":
            return Pair(y.clamp(max=0), y.clamp(min=0))
        return Heads(y, OrderedDict(b=y.sigmoid(), a=y.tanh()))


def _structure(value: Any) -> Any:
    """The container types and keys of an output, leaves aside."""
    if isinstance(value, dict):
        return (type(value), tuple((k, _structure(v)) for k, v in value.items()))
    if isinstance(value, tuple | list):
        return (type(value), tuple(_structure(v) for v in value))
    if isinstance(value, Heads):
        return (Heads, _structure(value.logits), _structure(value.extra))
    return type(value)


@pytest.mark.parametrize("kind", ["ordered", "reversed", "namedtuple", "dataclass"])
def test_the_output_container_is_the_models_own(kind: str) -> None:
    torch.manual_seed(0)
    model = Containers(kind).eval()
    fmodel = clouseau.instrument(model, select="*", path=None)
    for batch in (2, 3):  # the first call (the probe) and a later one at another shape
        x = torch.randn(batch, 4)
        with torch.no_grad():
            want, got = model(x), fmodel(x)
        assert _structure(got) == _structure(want)
        for a, e in zip(tensors_of(got), tensors_of(want), strict=True):
            np.testing.assert_array_equal(a.numpy(), e.numpy())
        np.testing.assert_array_equal(
            fmodel.captured.get("fc", call=fmodel.captured.calls[-1]), model.fc(x).detach().numpy()
        )
    assert fmodel.captured.graph.trace_kind is TraceKind.TORCH_FX
    assert fmodel.traces == 1


class Pooled(nn.Module):
    """A ``ModelOutput`` with its keys set out of field order (InternVL's vision tower
    sets ``pooler_output`` last) and a key set to None (a ``ModelOutput`` holds only what
    was set); ``tier`` "export" adds a branch torch.fx cannot trace."""

    def __init__(self, tier: str) -> None:
        super().__init__()
        self.tier = tier
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        y = self.fc(x)
        if self.tier == "export" and x.shape[0] > 0:
            y = y * 2
        out = BaseModelOutputWithPooling(last_hidden_state=y, hidden_states=(y + 1, y - 1))
        out["attentions"] = None
        out.pooler_output = y.mean(0)
        return out


@pytest.mark.parametrize("tier", ["fx", "export"])
def test_a_model_output_keeps_eagers_keys_in_eagers_order(tier: str) -> None:
    torch.manual_seed(0)
    model = Pooled(tier).eval()
    fmodel = clouseau.instrument(model, select="*", path=None)
    x = torch.randn(2, 4)
    with torch.no_grad():
        want, got = model(x), fmodel(x)
    assert fmodel.captured.graph.trace_kind is TIERS[tier]
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    assert len(got.to_tuple()) == len(want.to_tuple())
    for a, e in zip(tensors_of(got.to_tuple()), tensors_of(want.to_tuple()), strict=True):
        np.testing.assert_array_equal(a.numpy(), e.numpy())
    fmodel.close()
