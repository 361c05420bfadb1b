"""PyTorch models for the benchmarks, built in the repo (no downloads, random weights).

The shapes follow the issue: an MLP of 8 x (Linear 512 + ReLU) on a batch of 64, a
ResNet-18-shaped CNN on 8x3x224x224 (torchvision's module names, ``ReLU(inplace=True)``
reused twice per block, so the snapshot semantics are exercised), and a GPT-2-small-shaped
decoder (6 layers, width 384, 6 heads, sequence 128, GPT-2's vocabulary). ``tiny`` shrinks
every model so that the smoke test runs in seconds; the names and structure stay the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TorchCase:
    """A model with its example input and the glob that selects its activation function."""

    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    act_glob: str  # "relu*" where the model has ReLUs, "gelu*" for the decoder
    act_func: str  # the same for TorchLens's tl.func selector


class MLP(nn.Sequential):
    """``depth`` x (Linear(width, width) + ReLU), as one flat Sequential (names 0, 1, ...)."""

    def __init__(self, depth: int = 8, width: int = 512) -> None:
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        super().__init__(*layers)


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: two 3x3 convs, one ReLU module used twice."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """ResNet-18 with torchvision's layout and module names (``width`` scales the channels)."""

    def __init__(self, num_classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(w, w), BasicBlock(w, w))
        self.layer2 = nn.Sequential(BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w))
        self.layer3 = nn.Sequential(BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w))
        self.layer4 = nn.Sequential(BasicBlock(4 * w, 8 * w, 2), BasicBlock(8 * w, 8 * w))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class CausalSelfAttention(nn.Module):
    """GPT-2 attention: one fused qkv projection, causal SDPA, an output projection."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GPTMLP(nn.Module):
    """GPT-2's feed-forward block: width -> 4 width -> GELU(tanh) -> width."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPTBlock(nn.Module):
    """A pre-norm GPT-2 block."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = GPTMLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A GPT-2-shaped decoder: token + position embeddings, blocks, final norm, LM head."""

    def __init__(
        self, layers: int = 6, width: int = 384, heads: int = 6, vocab: int = 50257, ctx: int = 128
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(ctx, width)
        self.h = nn.ModuleList(GPTBlock(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def mlp_case(
    tiny: bool = False, quick: bool = False, depth: int | None = None, width: int | None = None
) -> TorchCase:
    """The MLP: 8 x (Linear 512 + ReLU) on a batch of 64 (``depth``/``width`` for scaling)."""
    depth = depth if depth is not None else (3 if tiny else 8)
    width = width if width is not None else (32 if tiny else 512)
    batch = 4 if tiny else 64
    model = _ready(lambda: MLP(depth, width))
    return TorchCase("mlp", model, (torch.randn(batch, width),), "relu*", "relu")


def cnn_case(tiny: bool = False, quick: bool = False) -> TorchCase:
    """ResNet-18 on 8x3x224x224 (quick: a batch of 2; tiny: width 8 on 2x3x32x32)."""
    model = _ready(lambda: ResNet18(num_classes=10 if tiny else 1000, width=8 if tiny else 64))
    x = torch.randn(2, 3, 32, 32) if tiny else torch.randn(2 if quick else 8, 3, 224, 224)
    return TorchCase("cnn", model, (x,), "relu*", "relu")


def gpt_case(tiny: bool = False, quick: bool = False) -> TorchCase:
    """The GPT-2-small-shaped decoder: 6 layers, width 384, sequence 128, batch 2 (quick: 1)."""
    if tiny:
        model = _ready(lambda: GPT(layers=2, width=32, heads=2, vocab=97, ctx=16))
        idx = torch.randint(0, 97, (1, 16))
    else:
        model = _ready(lambda: GPT())
        idx = torch.randint(0, 50257, (1 if quick else 2, 128))
    return TorchCase("gpt", model, (idx,), "gelu*", "gelu")


# name -> builder(tiny, quick). --quick shrinks the batch of the two slow models so that the
# whole suite fits in two minutes; the titles in RESULTS.md show the shapes measured.
CASES: dict[str, Callable[[bool, bool], TorchCase]] = {
    "mlp": mlp_case,
    "cnn": cnn_case,
    "gpt": gpt_case,
}


def _ready(build: Callable[[], nn.Module]) -> nn.Module:
    # A fixed seed makes every process build the same weights; eval() because the
    # benchmarks measure inference (BatchNorm uses its running statistics).
    torch.manual_seed(0)
    return build().eval()
