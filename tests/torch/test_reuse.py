"""A second instrumented model of a model already seen reuses the lowered graph (reuse.py).

Its first call runs no trace, and every value still equals the eager model's; a module or a
weight replaced since, another selection or an intervention derive a graph of their own.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import clouseau


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)) * 2)


def _eager(model: Net, x: torch.Tensor) -> dict[str, np.ndarray]:
    h = model.fc1(x)
    return {"relu": torch.relu(h).numpy(), "mul": (torch.relu(h) * 2).numpy()}


def _run(model: nn.Module, x: torch.Tensor, select: object = ("relu", "mul")) -> tuple[int, dict]:
    with clouseau.instrument(model, select=list(select), path=None) as fmodel:  # type: ignore[call-overload]
        y = fmodel(x)
    assert torch.equal(y, model(x))
    return fmodel.traces, {n: fmodel.captured[n] for n in fmodel.captured.names()}


@torch.no_grad()
def test_a_second_instrument_reuses_the_graph_and_saves_the_same_values() -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 6)
    traces, first = _run(model, x)
    assert traces == 1
    traces, again = _run(model, x)
    assert traces == 0  # nothing traced: the graph of the first instrument
    want = _eager(model, x)
    for got in (first, again):
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


@torch.no_grad()
def test_a_replaced_module_or_weight_or_another_selection_traces_again() -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 6)
    assert _run(model, x)[0] == 1
    assert _run(model, x, ("relu",))[0] == 1  # another selection
    model.fc1 = nn.Linear(6, 6)  # another module
    traces, got = _run(model, x)
    assert traces == 1
    np.testing.assert_array_equal(got["relu"], _eager(model, x)["relu"])
    model.fc1.weight = nn.Parameter(torch.randn(6, 6))  # another weight
    traces, got = _run(model, x)
    assert traces == 1
    np.testing.assert_array_equal(got["mul"], _eager(model, x)["mul"])
    # Weights changed in place are read by the graph as the model reads them: no retrace.
    model.fc1.weight.mul_(0.5)
    traces, got = _run(model, x)
    assert traces == 0
    np.testing.assert_array_equal(got["mul"], _eager(model, x)["mul"])


class Shifted(nn.Module):
    """Reads a buffer: replacing it is a new graph, as replacing a weight is."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.register_buffer("shift", torch.ones(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x) + self.shift)


@torch.no_grad()
def test_a_replaced_buffer_traces_again() -> None:
    torch.manual_seed(0)
    model, x = Shifted().eval(), torch.randn(4, 6)
    assert _run(model, x, ("relu",))[0] == 1
    assert _run(model, x, ("relu",))[0] == 0
    model.shift = torch.full((6,), -0.5)  # a new buffer object: its id is in the key
    traces, got = _run(model, x, ("relu",))
    assert traces == 1
    np.testing.assert_array_equal(got["relu"], torch.relu(model.fc(x) - 0.5).numpy())


@torch.no_grad()
def test_interventions_are_never_reused() -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 6)
    for _ in range(2):
        with clouseau.instrument(
            model, select="mul", path=None, intervene={"relu": clouseau.zero()}
        ) as fmodel:
            fmodel(x)
        assert fmodel.traces == 1
        np.testing.assert_array_equal(fmodel.captured["mul"], np.zeros((4, 6), np.float32))


@pytest.mark.parametrize("shape", [(4, 6), (2, 6)])
@torch.no_grad()
def test_another_shape_is_its_own_graph(shape: tuple[int, int]) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    _run(model, torch.randn(4, 6))
    x = torch.randn(*shape)
    traces, got = _run(model, x)
    assert traces == (0 if shape == (4, 6) else 1)
    np.testing.assert_array_equal(got["relu"], _eager(model, x)["relu"])
