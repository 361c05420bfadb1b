"""``torch.enable_grad()``, ``torch.no_grad()`` and ``torch.inference_mode()`` blocks inside
``forward``: the outputs' ``requires_grad`` and inference-ness equal eager's under every
outer mode, and every module output equals forward hooks on the eager model, on every
call, at two shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import clouseau
from tests.torch.conftest import assert_same, eager_with_hooks

OUTER: dict[str, Callable[[], Any]] = {
    "grad": torch.enable_grad,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


class GradBlocks(torch.nn.Module):
    """An ``enable_grad`` and a ``no_grad`` block; a shape test torch.fx cannot trace."""

    inner: Callable[[], Any] = staticmethod(torch.no_grad)

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.shape[0] > 1:  # torch.export's tier
            x = x + 1
        with torch.enable_grad():
            y = self.a(x)
        with self.inner():
            z = self.b(x)
        return y, z, y.sum() * 2


class InferenceBlock(GradBlocks):
    """An ``inference_mode`` block, which torch.export does not record."""

    inner = staticmethod(torch.inference_mode)


class InferenceOps(GradBlocks):
    """An ``inference_mode`` block of plain ops, no submodule called inside it."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.shape[0] > 1:  # torch.export's tier
            x = x + 1
        y = self.a(x)
        with torch.inference_mode():
            z = y * 2 + 1
        return y, self.b(x), z


def _flags(out: tuple[torch.Tensor, ...]) -> list[tuple[bool, bool]]:
    return [(t.requires_grad, t.is_inference()) for t in out]


def _check(model: torch.nn.Module, fmodel: Any, outer: str) -> None:
    for call, rows in enumerate((3, 5)):  # two shapes
        x = torch.randn(rows, 4)
        with OUTER[outer]():
            expected = model(x)
        _, hooks = eager_with_hooks(model, x)
        with OUTER[outer]():
            out = fmodel(x)
        assert _flags(out) == _flags(expected)
        for got, want in zip(out, expected, strict=True):
            assert_same(got.detach(), want.detach())
        for path in ("a", "b"):
            assert_same(fmodel.captured.get(path, call=call), hooks.outputs[path][0])
    assert fmodel.captured.calls == (0, 1)


@pytest.mark.parametrize("outer", list(OUTER))
def test_grad_blocks_on_the_export_path(outer: str) -> None:
    # Export records a block only where it changes the mode it traces under: a graph
    # serves the grad mode it was traced under, and another mode traces its own.
    model = GradBlocks()
    fmodel = clouseau.instrument(model, select="*", path=None)
    _check(model, fmodel, outer)
    assert fmodel._tier is None  # traced, not the dynamic tier
    again = torch.randn(5, 4)
    for mode in OUTER.values():  # every mode after another, each its own graph
        with mode():
            assert _flags(fmodel(again)) == _flags(model(again))


@pytest.mark.parametrize("block", [InferenceBlock, InferenceOps], ids=["module", "ops"])
@pytest.mark.parametrize("outer", ["grad", "no_grad"])
def test_an_inference_mode_block_takes_the_dynamic_tier(outer: str, block: type) -> None:
    # torch.export would trace the block's ops as plain ones (their outputs requiring
    # grads): the block is an export failure, and the dynamic tier runs forward itself;
    # a block of ops alone too (export's values in it are inference tensors).
    model = block()
    fmodel = clouseau.instrument(model, select="*", path=None)
    with pytest.warns(UserWarning, match="inference_mode"):
        _check(model, fmodel, outer)


@pytest.mark.parametrize("block", [InferenceBlock, InferenceOps], ids=["module", "ops"])
def test_a_call_in_inference_mode_with_an_inference_block_inside(block: type) -> None:
    # Inside an outer inference_mode the block changes nothing: the traced path serves.
    model = block()
    fmodel = clouseau.instrument(model, select="*", path=None)
    _check(model, fmodel, "inference_mode")
    assert fmodel._tier is None
