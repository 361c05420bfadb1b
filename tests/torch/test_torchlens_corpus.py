"""TorchLens' corpus models its package does not ship (``tests/torch/torchlens_models.py``):
every module output of every call, at two shapes, equals a forward hook on eager, on each
tier the model takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import clouseau
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


def test_transformer_encoder_model_on_the_traced_path() -> None:
    # nn.TransformerEncoder and its layers are built-ins, leaves of torch.fx by default:
    # the tracer takes their Python path (tracing/builtins.py), the one forward hooks see,
    # so every submodule of every layer is a point of the fx graph, equal to eager's.
    torch.manual_seed(0)
    model = tl.TransformerEncoderModel().eval()
    fmodel = check_every_call(model, CALLS)
    assert fmodel.captured.graph.trace_kind is TraceKind.TORCH_FX and fmodel.traces == 1
    assert {"encoder.layers.1.self_attn:0", "encoder.layers.0.linear2"} <= set(
        fmodel.captured.names()
    )
    # The reference is the model's own value: its fused fast path (no hooks attached)
    # gives the same outputs as the Python path the trace and the hooks take.
    with torch.no_grad():
        for x in CALLS:
            torch.testing.assert_close(fmodel(x), model(x), rtol=0, atol=0)


def test_transformer_encoder_with_a_mask_stays_a_leaf() -> None:
    # A mask's dtype and causality are checked on its values, which fx cannot trace:
    # such a call keeps the encoder one leaf node, as torch.fx does. The leaf runs the
    # fused fast path, as the model does without hooks (hooks on its layers would turn it
    # off and change the last bits): outputs and the encoder's output are the model's own.
    torch.manual_seed(0)
    masked = tl.MaskedEncoder(tl.TransformerEncoderModel()).eval()
    fmodel = clouseau.instrument(masked, select="*", path=None)
    seen: list[torch.Tensor] = []
    for call, x in enumerate(CALLS):
        seen.clear()
        hook = masked.model.encoder.register_forward_hook(lambda m, a, out: seen.append(out))
        with torch.no_grad():
            want = masked(x)
        hook.remove()
        with torch.no_grad():
            got = fmodel(x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        cap = fmodel.captured
        np.testing.assert_array_equal(cap.get("model.encoder", call=call), seen[0].numpy())
    assert fmodel.captured.graph.trace_kind is TraceKind.TORCH_FX
    assert "model.encoder.layers.0.linear1" not in fmodel.captured.names()
