"""The hook path and the traced path agree on every module output.

Each model runs once with a selection of every dotted module path as globs (the hook
path: forward hooks, no trace) and once with the same selection as a Selector object
(which the hook path does not take: a traced tier, or the dynamic tier for the
data-dependent corpus). Both captures hold the same names, with equal values (bitwise).
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


def _agree(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    select = _dotted_paths(model)
    assert select
    traced = clouseau.instrument(model, select=as_selector(select), path=None)
    hooked = clouseau.instrument(model, select=select, path=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dynamic tier's warning
        torch.manual_seed(0)
        with torch.no_grad():
            traced(*args, **kwargs)
        torch.manual_seed(0)
        with torch.no_grad():
            hooked(*args, **kwargs)
    want, got = traced.captured, hooked.captured
    assert got.graph.trace_kind is TraceKind.TORCH_HOOKS
    assert want.graph.trace_kind is not TraceKind.TORCH_HOOKS
    assert set(got.names()) == set(want.names())
    for name in want.names():
        np.testing.assert_array_equal(got.get(name, call=0), want.get(name, call=0), name)


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
    [dm.IfMean, dm.NestedIf, dm.WhileNorm, dm.TopKMoE, dm.EarlyExit],
    ids=lambda m: m.__name__,
)
def test_the_dynamic_corpus(make: Callable[[], torch.nn.Module]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(make()).eval()  # paths "0.<module>": dotted globs
    _agree(model, (torch.randn(4, 6) * 2,), {})
