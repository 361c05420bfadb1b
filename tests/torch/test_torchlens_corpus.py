"""TorchLens' corpus models its package does not ship (``tests/torch/torchlens_models.py``):
every module output of every call, at two shapes, equals a forward hook on eager, on each
tier the model takes."""

from __future__ import annotations

import pytest
import torch

from clouseau.ir.graph import TraceKind
from tests.torch import torchlens_models as tl
from tests.torch.test_seams import check_every_call, eager_points


def _ids(seed: int, shape: tuple[int, int]) -> torch.Tensor:
    return torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(seed))


CALLS = [_ids(0, (2, 5)), _ids(1, (3, 7)), _ids(2, (2, 5))]


def _every_module(model: torch.nn.Module) -> list[str]:
    """Every called submodule's output and, where it has any, its elements, as module
    globs: the hook path (dotless globs such as ``embed`` take the traced path, and a
    glob that matches no point is an error)."""
    _, points = eager_points(model, CALLS[0])
    tupled = {name.split(":")[0] for name in points if ":" in name}
    called = {name.split(":")[0] for name in points}  # a ModuleList is never called
    paths = [p for p, _ in model.named_modules() if p in called and "." in p]
    return [*paths, *(f"{p}:*" for p in paths if p in tupled)]


def test_moe_model_on_the_traced_path() -> None:
    torch.manual_seed(0)
    fmodel = check_every_call(tl.MoEModel().eval(), CALLS)
    assert fmodel.captured.graph.trace_kind is TraceKind.TORCH_FX
    assert fmodel.traces == 1
    # The loop's expert calls are each their own point, in every layer.
    assert {"moes.1.experts.3.2", "moes.0.router", "moes.1:1"} <= set(fmodel.captured.names())


@pytest.mark.parametrize("make", [tl.MoEModel, tl.TransformerEncoderModel])
def test_torchlens_models_on_the_hook_path(make: type[torch.nn.Module]) -> None:
    torch.manual_seed(0)
    model = make().eval()
    fmodel = check_every_call(model, CALLS, _every_module(model))
    assert fmodel.captured.graph.trace_kind is TraceKind.TORCH_HOOKS
    assert fmodel.traces == 0


@pytest.mark.xfail(
    reason="nn.TransformerEncoder is a built-in, so a leaf of the fx trace: its layers' "
    "modules are no points; tracing through it takes torch.export, whose attention is "
    "not bitwise to eager's",
    strict=True,
)
def test_transformer_encoder_model_on_the_traced_path() -> None:
    torch.manual_seed(0)
    check_every_call(tl.TransformerEncoderModel().eval(), CALLS)
