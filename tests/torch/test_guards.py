"""A traced graph is re-used only for the calls it holds for: never a different value.

An exported graph specializes on what the model branches on (a dimension, a flag, a
module attribute); a call for which that no longer holds must trace again, and every
call's saved values and outputs equal the eager model's (forward hooks) of that call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import clouseau
from tests.torch.conftest import assert_same, eager_with_hooks


class ShapeBranch(torch.nn.Module):
    """Branches on a dimension (export keeps it dynamic with a guard) and reads a plain
    attribute (``scale``) and a flag argument, both baked into any graph as constants."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.act = torch.nn.Tanh()
        self.scale = 2.0

    def forward(self, x: torch.Tensor, mask: torch.Tensor, flip: bool = False) -> torch.Tensor:
        h = self.act(self.lin(x) * self.scale)
        if x.shape[1] > 4:
            h = h.cumsum(1)
        if flip:
            h = -h
        return h.masked_fill(mask[..., None] == 0, 0.0)


def _check_call(fmodel: Any, model: torch.nn.Module, call: int, *args: Any, **kw: Any) -> None:
    expected, hooks = eager_with_hooks(model, *args, **kw)
    with torch.no_grad():
        out = fmodel(*args, **kw)
    assert torch.equal(out, expected)
    for path in ("lin", "act"):
        assert_same(fmodel.captured.get(path, call=call), hooks.outputs[path][0])


def test_an_export_guard_that_fails_traces_again() -> None:
    model = ShapeBranch().eval()
    fmodel = clouseau.instrument(model, select=["lin", "act"], path=None)
    shapes = [(2, 3), (2, 5), (3, 6), (1, 1), (2, 4), (3, 7), (1, 2)]
    for call, (b, n) in enumerate(shapes):
        mask = (torch.rand(b, n) > 0.5).long()  # same shape, other values: no new trace
        _check_call(fmodel, model, call, torch.randn(b, n, 8), mask)
    # The static export, then dynamic ones: each side of `n > 4`, and size 1.
    assert fmodel.traces <= 5


def test_a_changed_module_attribute_is_never_served_by_a_stale_graph() -> None:
    model = ShapeBranch().eval()
    fmodel = clouseau.instrument(model, select=["lin", "act"], path=None)
    x, mask = torch.randn(2, 3, 8), torch.ones(2, 3, dtype=torch.long)
    _check_call(fmodel, model, 0, x, mask)
    model.scale = 3.0  # baked into the first graph as 2.0
    _check_call(fmodel, model, 1, x, mask)
    assert fmodel.traces == 2
    model.scale = 2.0  # back to the first graph's: no third trace
    _check_call(fmodel, model, 2, x, mask)
    assert fmodel.traces == 2


def test_a_changed_training_flag_or_argument_selects_its_own_graph() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).eval()
    fmodel = clouseau.instrument(model, select=["0", "1"], path=None)
    x = torch.randn(4, 8)
    fmodel(x)
    model[1].train()  # one submodule's flag: the eval graph would skip the dropout
    torch.manual_seed(1)
    out = fmodel(x)
    torch.manual_seed(1)
    assert torch.equal(out, model(x))
    assert fmodel.traces == 2

    branch = ShapeBranch().eval()
    fbranch = clouseau.instrument(branch, select=["lin", "act"], path=None)
    mask = torch.ones(2, 3, dtype=torch.long)
    for call, flip in enumerate([False, True, False]):
        _check_call(fbranch, branch, call, torch.randn(2, 3, 8), mask, flip=flip)


@pytest.mark.parametrize("n", [3, 6])
def test_values_never_come_from_a_graph_of_other_data(n: int) -> None:
    # Equal shapes, other tensor values (a padding mask): the graph computes from the data.
    model = ShapeBranch().eval()
    fmodel = clouseau.instrument(model, select=["lin", "act"], path=None)
    x = torch.randn(2, n, 8)
    for call in range(3):
        mask = torch.ones(2, n, dtype=torch.long)
        mask[call % 2, : call + 1] = 0
        _check_call(fmodel, model, call, x, mask)
    assert fmodel.traces == 1
