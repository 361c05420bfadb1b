"""timm models (weights=None), including one only torch.export can trace."""

from __future__ import annotations

import pytest
import torch

from clouseau.ir.graph import TraceKind
from tests.models.helpers import check_model

timm = pytest.importorskip("timm")

# Small variants: the architecture's code at a fraction of the size.
OPTIONS = {
    "swin_tiny_patch4_window7_224": {
        "depths": (1, 1, 1, 1), "embed_dim": 32, "num_heads": (1, 2, 2, 4), "img_size": 56,
    },
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "size", "trace_kind"),
    [
        # 76 Identity and 18 DropPath outputs the export path used to miss
        ("mobilevitv2_050", 64, TraceKind.TORCH_EXPORT),
        ("resnet10t", 32, TraceKind.TORCH_FX),
        # windowed attention with relative position bias, shifted windows (torch.roll)
        ("swin_tiny_patch4_window7_224", 56, TraceKind.TORCH_FX),
    ],
)
def test_every_module_output_equals_a_forward_hook(
    name: str, size: int, trace_kind: TraceKind
) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **OPTIONS.get(name, {})).eval()
    graph = check_model(model, torch.randn(1, 3, size, size))
    assert graph.trace_kind is trace_kind
    if name == "mobilevitv2_050":
        assert (
            "stages.0.0.attn" in graph.names()
            or "stages.2.1.transformer.0.drop_path1" in graph.names()
        )
