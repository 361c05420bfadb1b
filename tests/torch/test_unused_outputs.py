"""Every module call is a point, also when nothing downstream uses its output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clouseau.ir.graph import TraceKind
from tests.models.helpers import check_model


class AuxHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.out = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(x).softmax(-1) * 2)


class Discarding(nn.Module):
    """Auxiliary heads computed and thrown away, in the open and inside a no_grad region."""

    def __init__(self, export: bool) -> None:
        super().__init__()
        self.export = export
        self.body = nn.Linear(4, 4)
        self.aux = AuxHead()
        self.view = nn.Flatten(0)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.export and x.shape[0] > 0:  # fx cannot follow a branch on a shape
            x = x + 0
        h = self.body(x)
        self.aux(h)  # an auxiliary head: computed, its output unused
        self.view(h)
        if self.export:  # fx does not record no_grad; export keeps it as a region
            with torch.no_grad():
                self.aux(h * 3)
        return self.act(h)


@pytest.mark.parametrize("export", [False, True], ids=["fx", "export"])
def test_a_module_whose_output_nothing_uses_is_a_point(export: bool) -> None:
    graph = check_model(Discarding(export).eval(), torch.randn(3, 4))
    assert graph.trace_kind is (TraceKind.TORCH_EXPORT if export else TraceKind.TORCH_FX)
    calls = [name for _, name in graph.meta_value("module_calls")]
    expected = ["body", "aux.fc", "aux.out", "aux", "view"]
    if export:
        expected += ["aux.fc_1", "aux.out_1", "aux_1"]
    assert calls == [*expected, "act"]
    assert set(calls) <= set(graph.names())
