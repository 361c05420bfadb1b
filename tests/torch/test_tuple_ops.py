"""Ops that return a tuple of tensors name their elements as modules do: ``<op>:<i>``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import clouseau
from clouseau.ir.graph import TraceKind


class TupleOps(nn.Module):
    def __init__(self, export: bool) -> None:
        super().__init__()
        self.export = export
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.export and x.shape[0] > 0:  # fx cannot follow a branch on a shape
            x = x + 0
        h = self.fc(x)
        a, b = torch.chunk(h, 2, dim=-1)
        s0, s1, s2 = h.split(3, dim=-1)
        u0, u1 = h.unbind(0)
        values, indices = h.topk(3)
        top, where = h.max(dim=1)
        ordered, order = torch.sort(h, dim=-1)
        floats = (a * b).sum() + s0.sum() + s1.sum() + s2.sum() + u0.sum() + u1.sum()
        ints = indices.sum() + where.sum() + order.sum()
        return floats + values.sum() + top.sum() + ordered.sum() + ints


def _eager(h: torch.Tensor) -> dict[str, tuple[torch.Tensor, ...]]:
    """The ops of TupleOps on ``fc``'s output, eagerly."""
    return {
        "chunk": torch.chunk(h, 2, dim=-1), "split": h.split(3, dim=-1), "unbind": h.unbind(0),
        "topk": tuple(h.topk(3)), "max": tuple(h.max(dim=1)), "sort": tuple(torch.sort(h, dim=-1)),
    }  # fmt: skip


@pytest.mark.parametrize("export", [False, True], ids=["fx", "export"])
def test_tuple_op_elements_are_points_named_like_module_tuple_elements(export: bool) -> None:
    model = TupleOps(export).eval()
    x = torch.randn(2, 8)
    seen: list[torch.Tensor] = []
    handle = model.fc.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    expected_out = model(x)
    handle.remove()
    fmodel = clouseau.instrument(model, select="*", path=None)
    assert torch.equal(fmodel(x), expected_out)
    captured = fmodel.captured
    frontend = TraceKind.TORCH_EXPORT if export else TraceKind.TORCH_FX
    assert captured.graph.trace_kind is frontend
    names = set(captured.names())
    for op, elements in _eager(seen[0]).items():
        for i, want in enumerate(elements):
            assert f"{op}:{i}" in names, (op, i, sorted(names))
            got = captured[f"{op}:{i}"]
            assert got.dtype == want.numpy().dtype and (got == want.numpy()).all(), (op, i)
        assert (captured[op] == elements[0].numpy()).all()  # the op alone: its first element
        assert captured.graph.node(f"{op}:tuple")  # the call itself, not a point
        assert f"{op}:tuple" not in names
