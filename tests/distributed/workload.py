"""The model and data every distributed test and example shares (seeded, small)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

BATCHES = 6
BATCH_SIZE = 4
SELECT = ["fc1", "act", "block.fc"]


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) + x


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.act = torch.nn.ReLU()
        self.block = Block()
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.block(self.act(self.fc1(x))))


def model() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(BATCH_SIZE, 8, generator=generator) for _ in range(BATCHES)]


def eager_points() -> list[dict[str, torch.Tensor]]:
    """Every selected point of every batch, by forward hooks on the eager model."""
    net = model()
    seen: dict[str, torch.Tensor] = {}
    for name in SELECT:
        module = net.get_submodule(name)
        module.register_forward_hook(
            lambda _m, _i, out, name=name: seen.__setitem__(name, out.detach().clone())
        )
    out = []
    with torch.no_grad():
        for batch in batches():
            net(batch)
            out.append(dict(seen))
    return out


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` (but the lock) and its bytes: what a refused run must keep."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != ".clouseau.lock")
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in files}


def assert_equals_eager(cap: Any) -> None:
    """``cap`` holds every batch's selected points, equal to forward hooks on the eager model."""
    assert cap.calls == tuple(range(BATCHES))
    for call, eager in enumerate(eager_points()):
        for name in SELECT:
            np.testing.assert_allclose(cap.get(name, call=call), eager[name].numpy(), rtol=1e-6)
