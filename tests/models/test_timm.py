"""timm models (weights=None), including one only torch.export can trace."""

from __future__ import annotations

import pytest
import torch

from clouseau.ir.graph import TraceKind
from tests.models.helpers import check_model

timm = pytest.importorskip("timm")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "size", "trace_kind"),
    [
        # 76 Identity and 18 DropPath outputs the export path used to miss
        ("mobilevitv2_050", 64, TraceKind.TORCH_EXPORT),
        ("resnet10t", 32, TraceKind.TORCH_FX),
    ],
)
def test_every_module_output_equals_a_forward_hook(
    name: str, size: int, trace_kind: TraceKind
) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    graph = check_model(model, torch.randn(1, 3, size, size))
    assert graph.trace_kind is trace_kind
    if name == "mobilevitv2_050":
        assert (
            "stages.0.0.attn" in graph.names()
            or "stages.2.1.transformer.0.drop_path1" in graph.names()
        )
