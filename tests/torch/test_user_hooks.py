"""A user's forward hooks see the calls an eager model makes, and change what they change."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import clouseau
from clouseau.ir.graph import TraceKind
from tests.models.helpers import check_model


class Branchy(nn.Module):
    """With ``export``, a branch on a shape fx cannot follow: the export path."""

    def __init__(self, export: bool = True) -> None:
        super().__init__()
        self.export = export
        self.fc = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        if self.export and x.shape[0] > 1:
            x = x * scale
        return self.head(self.block(self.fc(x)))


def _hooks(model: Branchy) -> list[tuple[str, type, type]]:
    """A hook that scales fc's output, and one on block that only records its call."""
    seen: list[tuple[str, type, type]] = []

    def scale(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        seen.append(("fc", type(args[0]), type(out)))
        return out * 3

    def record(module: nn.Module, args: Any, kwargs: Any, out: torch.Tensor) -> torch.Tensor:
        seen.append(("block", type(args[0]), type(out)))
        return out - 1  # block is no leaf: fx traces through it

    model.fc.register_forward_hook(scale)
    model.block.register_forward_hook(record, with_kwargs=True)
    return seen


FRONTENDS = {"fx": TraceKind.TORCH_FX, "export": TraceKind.TORCH_EXPORT}


@pytest.mark.parametrize("path", list(FRONTENDS))
def test_user_hooks_run_once_per_call_on_real_tensors(path: str) -> None:
    model = Branchy(path == "export").eval()
    seen = _hooks(model)
    x = torch.randn(3, 4)
    expected = model(x)
    assert seen == [("fc", torch.Tensor, torch.Tensor), ("block", torch.Tensor, torch.Tensor)]
    fc_out = model.fc(x).detach()  # the hooked value: the Linear's output times 3
    seen.clear()
    fmodel = clouseau.instrument(model, select="*", path=None)
    for call in range(3):
        assert torch.equal(fmodel(x), expected)  # the graph scales as the hook does
        # once per call, never on export's fake tensors
        assert len(seen) == 2 * (call + 1)
        assert all(a is torch.Tensor and o is torch.Tensor for _, a, o in seen)
    captured = fmodel.captured
    assert captured.graph.trace_kind is FRONTENDS[path]
    assert fmodel.traces == 1
    for call in range(3):  # the module's point holds what the hook returned
        assert torch.equal(torch.from_numpy(captured.get("fc", call=call)), fc_out)
    assert [module for module, _, _ in seen[:2]] == ["fc", "block"]


@pytest.mark.parametrize("path", list(FRONTENDS))
def test_a_hook_removed_after_the_trace_no_longer_runs(path: str) -> None:
    model = Branchy(path == "export").eval()
    calls: list[int] = []
    handle = model.block.register_forward_hook(lambda m, a, out: calls.append(1))
    fmodel = clouseau.instrument(model, select="*", path=None)
    x = torch.randn(3, 4)
    fmodel(x)
    handle.remove()
    assert torch.equal(fmodel(x), model(x))
    assert calls == [1]


@pytest.mark.parametrize("path", list(FRONTENDS))
@pytest.mark.parametrize("hooked", [False, True], ids=["plain", "hooked"])
def test_module_outputs_with_user_hooks_equal_forward_hooks(hooked: bool, path: str) -> None:
    model = Branchy(path == "export").eval()
    if hooked:
        _hooks(model)
    graph = check_model(model, torch.randn(3, 4))
    assert graph.trace_kind is FRONTENDS[path]


@pytest.mark.parametrize("path", list(FRONTENDS))
def test_a_hook_on_the_model_itself_runs_once_per_call_around_the_graph(path: str) -> None:
    model = Branchy(path == "export").eval()
    seen: list[type] = []

    def double(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        seen.append(type(out))
        return out * 2

    model.register_forward_hook(double)
    x = torch.randn(3, 4)
    expected = model(x)
    fmodel = clouseau.instrument(model, select="*", path=None)
    for call in range(2):
        assert torch.equal(fmodel(x), expected)
        assert seen == [torch.Tensor] * (call + 2)  # the eager call, then one per call
    assert fmodel.captured.graph.trace_kind is FRONTENDS[path]


class _OwnCall(Branchy):
    """A model whose class defines its own ``__call__`` (it adds one to the output)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **kwargs) + 1


@pytest.mark.parametrize("root", ["hook", "pre_hook", "own_call", "global_hook"])
def test_the_hook_path_calls_the_model_as_a_call_would(root: str) -> None:
    """The hook path runs the model's forward itself only where ``nn.Module.__call__``
    would do nothing else: a hook on the model, a pre-hook, a process-wide hook or a
    ``__call__`` of its own still runs, once per call."""
    model = (_OwnCall if root == "own_call" else Branchy)(export=False).eval()
    seen: list[str] = []
    handle = None
    if root == "hook":
        model.register_forward_hook(lambda m, a, out: seen.append("hook") or out * 2)
    elif root == "pre_hook":
        model.register_forward_pre_hook(lambda m, a: seen.append("pre") or (a[0] * 2,))
    elif root == "global_hook":
        handle = nn.modules.module.register_module_forward_hook(
            lambda m, a, out: seen.append(type(m).__name__) if m is model else None
        )
    try:
        x = torch.randn(3, 4)
        expected = model(x)
        eager = list(seen)
        fmodel = clouseau.instrument(model, select=["block.0", "block.1"], path=None)
        for call in range(2):
            assert torch.equal(fmodel(x), expected)
            assert seen == eager * (call + 2)
        captured = fmodel.captured
        assert captured.graph.trace_kind is TraceKind.TORCH_HOOKS
        inner = model.block[0](model.fc(x * 2 if root == "pre_hook" else x)).detach()
        assert torch.equal(torch.from_numpy(captured.get("block.0", call=1)), inner)
    finally:
        if handle is not None:
            handle.remove()
