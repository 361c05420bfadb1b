"""Models with Python control flow on tensor values: neither torch.fx nor torch.export
can trace them, so clouseau runs them in the dynamic (TorchDynamo) tier."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class IfMean(nn.Module):
    """``if`` on a tensor mean: each call takes one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.up = nn.Linear(6, 6)
        self.down = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if x.mean() > 0:  # noqa: SIM108 - a statement branch, as models write it
            x = torch.relu(self.up(x))
        else:
            x = self.down(x) * 2
        return x + 1


class NestedIf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.c = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if x.sum() > 0:
            if x.max() > 1:  # noqa: SIM108
                x = self.b(x)
            else:
                x = self.c(x)
        else:
            x = -x
        return x.tanh()


class ChainedConditions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if (x.sum() > 0 and x.max() < 3) or x.min() > -0.5:
            x = self.b(x)
        return x * 3


class WhileNorm(nn.Module):
    """A ``while`` loop on a tensor norm: the trip count depends on the input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.shrink = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        while x.norm() > 1:
            x = self.shrink(x) * 0.5
        return x


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x))


class TopKMoE(nn.Module):
    """Top-2 Mixture-of-Experts routing; an expert runs only ``if mask.any()``."""

    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.gate = nn.Linear(6, experts)
        self.experts = nn.ModuleList(Expert() for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = torch.topk(self.gate(x).softmax(-1), 2, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            mask = (chosen == e).any(-1)
            if mask.any():
                w = (weights * (chosen == e)).sum(-1, keepdim=True)[mask]
                out[mask] += expert(x[mask]) * w
        return out


class RandomDepth(nn.Module):
    """A loop whose trip count comes from ``torch.randint`` (reproducible under a seed)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = int(torch.randint(1, 4, ()))
        for _ in range(steps):
            x = torch.sigmoid(self.fc(x))
        return x


class EarlyExit(nn.Module):
    """Returns after the first block when its output is confident enough."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.second = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.first(x))
        if x.abs().max() > 1.5:
            return self.head(x)
        x = torch.relu(self.second(x))
        return self.head(x)
