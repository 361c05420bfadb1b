"""The hook path and the traced path agree on every module output.

Each model runs once with a selection of every dotted module path as globs (the hook
path: forward hooks, no trace) and once with the same selection as a Selector object
(which the hook path does not take: a traced tier, or the dynamic tier for the
data-dependent corpus), on two calls of two batch sizes. Both captures hold the same
names, saved on the same calls, with equal values (bitwise).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import clouseau
from clouseau.ir.graph import TraceKind
from clouseau.ir.selection import as_selector
from tests.torch import dynamic_models as dm

Build = Callable[[], tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]]


def _dotted_paths(model: torch.nn.Module) -> list[str]:
    # A dotless glob also matches ops at the root: the hook path takes dotted ones only.
    return [p for p, _ in model.named_modules() if "." in p]


def _doubled(value: Any) -> Any:
    """``value`` at batch size twice its own, the second half other values than the first
    (ids rolled along the sequence, floats halved)."""
    if not isinstance(value, torch.Tensor):
        return value
    other = value.roll(1, -1) if not value.is_floating_point() else value * 0.5
    return torch.cat([value, other])


def _agree(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    select = _dotted_paths(model)
    assert select
    traced = clouseau.instrument(model, select=as_selector(select), path=None)
    hooked = clouseau.instrument(model, select=select, path=None)
    calls = [
        (args, kwargs),
        (tuple(map(_doubled, args)), {k: _doubled(v) for k, v in kwargs.items()}),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dynamic tier's warning
        for a, kw in calls:
            for fmodel in (traced, hooked):
                torch.manual_seed(0)
                with torch.no_grad():
                    fmodel(*a, **kw)
    want, got = traced.captured, hooked.captured
    assert got.graph.trace_kind is TraceKind.TORCH_HOOKS
    assert want.graph.trace_kind is not TraceKind.TORCH_HOOKS
    assert want.calls == got.calls == (0, 1)
    assert set(got.names()) == set(want.names())
    for name in want.names():
        assert got.calls_of(name) == want.calls_of(name), name
        for call in want.calls_of(name):
            np.testing.assert_array_equal(got.get(name, call=call), want.get(name, call=call), name)


def _transformers(name: str) -> Build:
    pytest.importorskip("transformers")
    from tests.models.test_transformers import MODELS

    return MODELS[name]


_HEAVY = ("t5", "whisper", "vit", "mixtral", "gemma", "mistral", "bert")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n in _HEAVY else n
        for n in ("gpt2", "llama", *_HEAVY)
    ],
)
def test_transformers_models(name: str) -> None:
    torch.manual_seed(0)
    model, args, kwargs = _transformers(name)()
    _agree(model.eval(), args, kwargs)


@pytest.mark.parametrize(
    "name", ["resnet18", pytest.param("mobilenet_v3_small", marks=pytest.mark.slow)]
)
def test_torchvision_models(name: str) -> None:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, num_classes=10).eval()
    _agree(model, (torch.randn(2, 3, 32, 32),), {})


@pytest.mark.parametrize(
    "make",
    [
        dm.IfMean,
        dm.NestedIf,
        dm.ChainedConditions,
        dm.WhileNorm,
        dm.TopKMoE,
        dm.RandomDepth,
        dm.EarlyExit,
    ],
    ids=lambda m: m.__name__,
)
def test_the_dynamic_corpus(make: Callable[[], torch.nn.Module]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(make()).eval()  # paths "0.<module>": dotted globs
    _agree(model, (torch.randn(4, 6) * 2,), {})


@pytest.mark.slow
@pytest.mark.parametrize(("name", "size"), [("resnet10t", 32)])
def test_timm_models(name: str, size: int) -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    _agree(model, (torch.randn(1, 3, size, size),), {})
