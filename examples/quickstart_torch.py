"""Quickstart: capture every ReLU of a ResNet-style model and look at what was saved.

Run it with ``./dev.sh demo`` (sets everything up first) or ``python examples/quickstart_torch.py``.
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import nn

import clouseau


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: the in-place ReLU is used twice, the residual added in place."""

    def __init__(self, channels_in: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or channels_in != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(channels_in, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 16))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, stride=2), BasicBlock(32, 32))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def main() -> None:
    torch.manual_seed(0)
    model = ResNet().eval()
    x = torch.randn(4, 3, 32, 32)
    path = tempfile.mkdtemp(prefix="clouseau-quickstart-")

    # Compile the model into one that saves every ReLU output; the block flushes to disk.
    with clouseau.instrument(model, select="relu*", path=path) as fmodel:
        y = fmodel(x)
    assert torch.equal(y, model(x)), "the instrumented model must return the model's outputs"

    cap = clouseau.load(path)
    table = Table(title=f"{len(cap)} ReLU outputs captured in {path}")
    for column in ("name", "shape", "dtype", "mean", "std", "min", "max", "zeros"):
        left = column in ("name", "shape", "dtype")
        table.add_column(column, justify="left" if left else "right", no_wrap=left)
    for name in cap.names():
        a = np.asarray(cap[name], dtype=np.float64)
        table.add_row(
            name, "×".join(map(str, a.shape)), str(cap[name].dtype),
            f"{a.mean():.4f}", f"{a.std():.4f}", f"{a.min():.4f}", f"{a.max():.4f}",
            f"{(a == 0).mean():.0%}",
        )  # fmt: skip
    console = Console(width=None if sys.stdout.isatty() else 110)
    console.print(table)
    console.print(
        f"Every point of the model: clouseau.trace(model, x).names() -> {len(clouseau.trace(model, x).names())} names"
    )
    console.print(f"Look at it on disk: clouseau show {path} --stats")


if __name__ == "__main__":
    main()
