"""What the zoo sweep found, each minimized to a model that shows it (docs/models.md)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import clouseau  # noqa: E402
from clouseau.ir import TraceKind  # noqa: E402
from tests.torch.conftest import assert_same, eager_with_hooks  # noqa: E402


class StaticSizesOnly(torch.nn.Module):
    """Reads its batch size as a plain int: torch.fx cannot trace it, torch.export can
    only with static shapes (timm's ``cpubone_nano``: the dynamic export's symbolic shapes
    hit an inequality sympy cannot solve, which is no data-dependent control flow)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x.shape[0], int):
            raise NotImplementedError("a symbolic batch size")
        return self.lin(x).relu() * x.shape[0]


def test_a_failed_dynamic_export_leaves_the_static_one_static() -> None:
    # The dynamic export of the second shape fails and leaves maybe_mark_dynamic's marks on
    # the input; the static export after it read them and failed too, so the model took
    # the dynamic tier (47 traces for 2 shapes for cpubone_nano).
    model = StaticSizesOnly().eval()
    fmodel = clouseau.instrument(model, select="*", path=None)
    for call, batch in enumerate((1, 2, 3)):
        x = torch.randn(batch, 4)
        expected, hooks = eager_with_hooks(model, x)
        with torch.no_grad():
            assert torch.equal(fmodel(x), expected)
        assert_same(fmodel.captured.get("lin", call=call), hooks.outputs["lin"][0])
        assert not hasattr(x, "_dynamo_weak_dynamic_indices")  # the user's tensor unmarked
    assert fmodel.captured.graph.trace_kind is TraceKind.TORCH_EXPORT
    assert fmodel.traces == 3  # a static export per shape, no dynamic tier
