"""Small models and synthetic data shared by the dataset tests (no downloads)."""

from __future__ import annotations

import numpy as np
import torch

SEQ = 24
VOCAB = 97


def gpt2() -> torch.nn.Module:
    """GPT-2 from a small config (two blocks), in eval mode."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2Model(config).eval()


def token_batches(samples: int, batch: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``samples`` sequences of 1..SEQ tokens, right-padded to SEQ, in batches."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, SEQ + 1, size=samples)
    ids = rng.integers(1, VOCAB, size=(samples, SEQ))
    mask = np.arange(SEQ)[None, :] < lengths[:, None]
    ids = np.where(mask, ids, 0)
    out = []
    for lo in range(0, samples, batch):
        out.append(
            {
                "input_ids": torch.from_numpy(ids[lo : lo + batch]),
                "attention_mask": torch.from_numpy(mask[lo : lo + batch].astype(np.int64)),
            }
        )
    return out


def seeded_mlp() -> torch.nn.Module:
    """tests/torch/models.py's MLP, with the same weights every time it is built (a resumed
    run must meet the model it started with)."""
    from tests.torch.models import MLP

    torch.manual_seed(1)
    return MLP()


def vectors(batches: int, batch: int = 6, d: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, d, generator=g) for _ in range(batches)]
