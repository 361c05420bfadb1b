"""Models of TorchLens' test corpus that its 2.36.1 package does not ship, written again
here with the same architectures: a mixture of experts whose experts run in a Python loop
behind a top-k router, and a classifier on ``nn.TransformerEncoder``."""

from __future__ import annotations

import torch
from torch import nn


class MoELayer(nn.Module):
    """Top-k routing over experts called one by one in a Python loop (every expert runs on
    every token; the router's weights pick what each adds)."""

    def __init__(self, dim: int = 8, experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.k = k
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for _ in range(experts)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.router(x)
        weights, chosen = torch.topk(logits.softmax(-1), self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            gate = (weights * (chosen == e)).sum(-1, keepdim=True)
            out = out + gate * expert(x)
        return out, logits


class MoEModel(nn.Module):
    """Embedding, two pre-norm MoE blocks with residuals, a head; returns the logits and
    every layer's router logits."""

    def __init__(self, vocab: int = 50, dim: int = 8, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.moes = nn.ModuleList(MoELayer(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        x = self.embed(ids)
        routers = []
        for norm, moe in zip(self.norms, self.moes, strict=True):
            out, logits = moe(norm(x))
            x = x + out
            routers.append(logits)
        return self.head(x), tuple(routers)


class TransformerEncoderModel(nn.Module):
    """Token and position embeddings, a two-layer ``nn.TransformerEncoder``, mean pooling
    and a classifier."""

    def __init__(self, vocab: int = 50, dim: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(32, dim)
        layer = nn.TransformerEncoderLayer(
            dim, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.classifier = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.encoder(self.embed(ids) + self.position(positions))
        return self.classifier(x.mean(1))


class MaskedEncoder(nn.Module):
    """:class:`TransformerEncoderModel`'s encoder called with a key padding mask (the
    last position of every sequence padded)."""

    def __init__(self, model: TransformerEncoderModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        model = self.model
        positions = torch.arange(ids.shape[1], device=ids.device)
        padded = (positions == ids.shape[1] - 1).expand(ids.shape[0], -1)
        x = model.encoder(model.embed(ids) + model.position(positions), src_key_padding_mask=padded)
        return model.classifier(x.mean(1))
