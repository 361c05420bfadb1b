"""One trace per input structure, not per shape: fx graphs take any shape, exported graphs
any shape their guards allow; every call's values equal eager; the IR is symbolic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import clouseau
from clouseau.ir.selection import as_selector
from tests.torch import dynamic_models as dm
from tests.torch import models
from tests.torch.conftest import assert_same, eager_with_hooks


def _check_modules(cap: clouseau.Capture, call: int, hooks: object, paths: list[str]) -> None:
    for path in paths:
        assert_same(cap.get(path, call=call), hooks.outputs[path][0])  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_cnn_traces_once_for_fifty_batch_sizes() -> None:
    model = models.ResNet().eval()
    paths = ["layer1", "layer2", "fc"]
    fmodel = clouseau.instrument(model, select=paths, path=None)
    # Batch 1 last: a size-1 dimension in the traced call prints as 1.
    for call, batch in enumerate([*range(2, 51), 1]):
        x = torch.randn(batch, 3, 8, 8)
        expected, hooks = eager_with_hooks(model, x)
        with torch.no_grad():
            assert_same(fmodel(x), expected)
        _check_modules(fmodel.captured, call, hooks, paths)
    assert fmodel.traces == 1
    graph = fmodel.captured.graph
    assert graph is not None
    assert "f32[s0,3,s1,s2] = input()" in str(graph)  # sizes that follow the input
    assert fmodel.captured.get("fc", call=48).shape == (50, 5)  # files: concrete shapes


@pytest.mark.slow
@pytest.mark.parametrize("traced", [True, False])
def test_gpt2_traces_a_few_times_for_fifty_sequence_lengths(traced: bool) -> None:
    # Module paths as globs take the hook path (no trace); as a Selector, the export path.
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
    model = GPT2LMHeadModel(config).eval()
    paths = ["transformer.h.0.mlp", "transformer.h.1.mlp", "transformer.ln_f"]
    select = as_selector(paths) if traced else paths
    fmodel = clouseau.instrument(model, select=select, path=None)
    lengths = [7, *range(1, 7), *range(8, 51)]  # a length of 1 is its own guard
    for call, length in enumerate(lengths):
        ids = torch.randint(0, 100, (2, length))
        expected, hooks = eager_with_hooks(model, ids, use_cache=False)
        with torch.no_grad():
            out = fmodel(ids, use_cache=False)
        assert_same(out.logits, expected.logits)
        _check_modules(fmodel.captured, call, hooks, paths)
    if not traced:
        assert fmodel.traces == 0
        assert fmodel.captured.graph.trace_kind is clouseau.ir.TraceKind.TORCH_HOOKS
        assert len(fmodel.captured.graphs) == 1  # ranks, not sizes
        return
    assert fmodel.traces <= 3
    assert fmodel.captured.graph.trace_kind is clouseau.ir.TraceKind.TORCH_EXPORT
    # The first export is static; a later shape's export is dynamic in what changed (the
    # length; the batch stays 2) and serves the rest.
    graphs = [str(g) for g in fmodel.captured.graphs]
    assert "%lm_head : f32[2,7,100] = linear" in graphs[0]
    assert "%lm_head : f32[2,s0,100] = linear" in graphs[-1]


class SamePadding(nn.Module):
    """TF-style "same" padding computed from the image size (timm's Conv2dSame), and a
    size check torch.fx cannot follow, so the model takes the export path."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 3:
            raise ValueError("three channels")
        pad_h = max((-(-x.shape[2] // 2) - 1) * 2 + 3 - x.shape[2], 0)
        pad_w = max((-(-x.shape[3] // 2) - 1) * 2 + 3 - x.shape[3], 0)
        x = nn.functional.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        return self.head(self.conv(x).relu().mean((2, 3)))


def test_a_later_export_frees_only_the_dimensions_that_changed() -> None:
    # Every dimension free made torch's symbolic shapes solve the paddings of H and W at
    # each layer (minutes for timm's tf_mobilenetv3 when only the batch changed).
    model = SamePadding().eval()
    fmodel = clouseau.instrument(model, select="*", path=None)
    shapes = [(1, 3, 9, 9), (2, 3, 9, 9), (5, 3, 9, 9), (2, 3, 12, 10), (3, 3, 7, 14)]
    for call, shape in enumerate(shapes):
        x = torch.randn(shape)
        expected, hooks = eager_with_hooks(model, x)
        with torch.no_grad():
            assert_same(fmodel(x), expected)
        _check_modules(fmodel.captured, call, hooks, ["conv", "head"])
    graphs = [str(g) for g in fmodel.captured.graphs]
    assert fmodel.captured.graph.trace_kind is clouseau.ir.TraceKind.TORCH_EXPORT
    assert "f32[1,3,9,9] = input()" in graphs[0]  # the first shape: static
    assert "f32[s0,3,9,9] = input()" in graphs[1]  # then the batch only
    assert "f32[s0,3,s1,s2] = input()" in graphs[2]  # then H and W too, and no more
    assert fmodel.traces == 3


class ShapeSwitch(nn.Module):
    """Takes another path for sequences longer than 4: export specializes on the length."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if x.shape[1] > 4:
            return y.sum(1)
        return y.mean(1)


def test_a_broken_export_guard_is_a_new_trace_not_a_wrong_value() -> None:
    model = ShapeSwitch()
    fmodel = clouseau.instrument(model, select="*", path=None)
    lengths = [2, 3, 4, 5, 6, 3, 9]
    for call, length in enumerate(lengths):
        x = torch.randn(2, length, 8)
        with torch.no_grad():
            assert_same(fmodel(x), model(x))
        saved = fmodel.captured.get("fc", call=call)
        assert_same(saved, model.fc(x).detach())
    assert fmodel.traces <= 3  # the first shape static, then one dynamic export per side
    assert {g.trace_kind for g in fmodel.captured.graphs} == {clouseau.ir.TraceKind.TORCH_EXPORT}


def test_a_shape_the_model_cannot_take_fails_with_its_own_error(tmp_path: object) -> None:
    model = models.CNN().eval()
    with clouseau.instrument(model, select="conv", path=tmp_path) as fmodel:
        fmodel(torch.randn(2, 3, 8, 8))
        with pytest.raises(RuntimeError, match=r"expected input.*to have 3 channels"):
            fmodel(torch.randn(2, 4, 8, 8))
        fmodel(torch.randn(1, 3, 5, 5))
    cap = clouseau.load(tmp_path)
    assert list(cap.failed_calls) == [1] and cap.calls == (0, 2)
    assert cap.get("conv", call=2).shape == (1, 6, 5, 5)


def test_a_new_branch_on_call_seven_keeps_every_earlier_call(tmp_path: object) -> None:
    model = dm.IfMean()
    with torch.no_grad():  # a(x) = x: the sign of the input picks the branch
        model.a.weight.copy_(torch.eye(6))
        model.a.bias.zero_()
    inputs = [torch.randn(3, 6).abs() + 1 for _ in range(7)]
    flip = -(torch.randn(3, 6).abs() + 1)
    with clouseau.instrument(model, select="*", path=tmp_path) as fmodel:
        with pytest.warns(UserWarning, match="dynamic"):
            for x in inputs:
                fmodel(x)
        fmodel(flip)
    cap = clouseau.load(tmp_path)
    assert cap.calls == tuple(range(8))
    for call, x in enumerate(inputs):
        assert cap.get("up", call=call) is not None and cap.get("down", call=call) is None
        np.testing.assert_array_equal(cap.get("a", call=call), x.numpy())
    assert cap.get("down", call=7) is not None and cap.get("up", call=7) is None
