"""Small models shared by the reliability tests (issue 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


class Small(nn.Module):
    """fc -> relu -> fc2: three named points besides the input."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc(x)))


class ValueBranch(nn.Module):
    """Python control flow on a tensor value: neither torch.fx nor torch.export follow it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:  # BRANCH-LINE
            return y.relu()
        return -y


class Failing(nn.Module):
    """A leaf (see ``mark_leaf``) that raises when its input holds ``trigger``.

    It fails by value, not by a call counter: tracing runs a leaf once more (the probe),
    which would shift a counter.
    """

    def __init__(self, error: BaseException, trigger: float = 999.0) -> None:
        super().__init__()
        self.error = error
        self.trigger = trigger

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x == self.trigger).any()):
            raise self.error
        return x * 2


class WithFailing(nn.Module):
    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fail = Failing(error)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.fail(x)).relu()


class Deep(nn.Module):
    """Six Linear+ReLU blocks: long enough for threads to interleave mid-call."""

    def __init__(self, width: int = 16, depth: int = 6) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).sum(-1)


def eager_blocks(model: Deep, x: torch.Tensor) -> list[torch.Tensor]:
    """The output of every block of ``model`` on ``x``, computed eagerly."""
    out = []
    with torch.no_grad():
        h = x
        for layer in model.layers:
            h = layer(h)
            out.append(h)
    return out


def line_of(marker: str, path: Path = Path(__file__)) -> int:
    """The line number of the line of ``path`` that holds ``marker``."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker} not in {path}")


def statm_rss() -> int:
    """Resident memory of this process in bytes, from /proc/self/statm."""
    import os

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)
