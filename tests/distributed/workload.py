"""The model and data every distributed test and example shares (seeded, small)."""

from __future__ import annotations

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
