"""Real workloads (issue 13): decoding, many shapes, data-dependent control flow.

Each row is a ratio of two wall times taken in one process, the clouseau run and the
plain one interleaved over ``cfg.reps`` repetitions (median of the ratios). "Tracing
included" rows build a fresh instrumented model each repetition, so its first-call trace
(and, for the dynamic tier, Dynamo's compile) is in the measured time.
"""

from __future__ import annotations

import importlib
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import clouseau
from bench.harness import Config
from bench.report import Check, Report, Table, fmt_s


def real_workloads(cfg: Config) -> Report:
    """Decode loop vs generate, 32 sequence lengths vs plain, dynamic tier vs eager."""
    torch.set_grad_enabled(False)
    report = Report(
        name="torch-workloads",
        title="PyTorch: real workloads (generation, many shapes, data-dependent branches)",
        description="Ratios of wall times in one process, clouseau run and plain run "
        "interleaved; median over repetitions. Tracing is included where a row says so.",
    )
    reps = max(3, cfg.reps // 2)
    rows: list[list[str]] = []
    for label, limit, pair in (
        ("decode loop, 64 new tokens, GPT-2 (select every block's MLP) vs plain "
         "generate, tracing included", 1.3, _decode(cfg)),
        ("32 batches of distinct sequence lengths vs the plain model, tracing included",
         1.3, _lengths(cfg)),
        ("dynamic tier (if on a tensor mean) vs plain eager, per call", 2.0, _dynamic(cfg)),
    ):  # fmt: skip
        ratio, ours, plain = _ratio(*pair, reps=reps)
        rows.append([label, fmt_s(plain), fmt_s(ours), f"{ratio:.3g}x"])
        report.checks.append(Check(label, ratio, limit, "<="))
    report.tables.append(
        Table("Medians (seconds) and the median ratio", ["row", "plain", "clouseau", "ratio"], rows)
    )
    return report


Step = Callable[[], Any]


def _ratio(ours: Step, plain: Step, reps: int) -> tuple[float, float, float]:
    ours(), plain()  # warm-up: kernels, imports, allocator
    ratios, a, b = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        plain()
        t1 = time.perf_counter()
        ours()
        t2 = time.perf_counter()
        a.append(t2 - t1)
        b.append(t1 - t0)
        ratios.append((t2 - t1) / (t1 - t0))
    return statistics.median(ratios), statistics.median(a), statistics.median(b)


def _gpt2(layers: int, width: int) -> Any:
    importlib.import_module("tests.conftest")  # torchvision's schemas, before transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers, n_head=4, n_embd=width, vocab_size=1000, n_positions=512,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def _decode(cfg: Config) -> tuple[Step, Step]:
    model = _gpt2(2 if cfg.tiny else 4, 64 if cfg.tiny else 256)
    prompt = torch.randint(2, 1000, (1, 16))
    new = 8 if cfg.tiny else 64
    select = [f"transformer.h.{i}.mlp" for i in range(model.config.n_layer)]

    def ours() -> None:
        fmodel = clouseau.instrument(model, select=select, path=None)
        fmodel.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    def plain() -> None:
        model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    return ours, plain


def _lengths(cfg: Config) -> tuple[Step, Step]:
    model = _gpt2(2 if cfg.tiny else 4, 64 if cfg.tiny else 256)
    batches = [torch.randint(2, 1000, (8, n)) for n in range(97, 129)]
    select = [f"transformer.h.{i}.mlp" for i in range(model.config.n_layer)]

    def ours() -> None:
        fmodel = clouseau.instrument(model, select=select, path=None)
        for ids in batches:
            fmodel(ids, use_cache=False)

    def plain() -> None:
        for ids in batches:
            model(ids, use_cache=False)

    return ours, plain


class _Branchy(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.up = nn.Linear(width, width)
        self.down = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(x))
        if x.mean() > 0.2:  # noqa: SIM108 - a statement branch, as models write it
            x = self.up(x)
        else:
            x = self.down(x) * 2
        return x.tanh()


def _dynamic(cfg: Config) -> tuple[Step, Step]:
    torch.manual_seed(0)
    width = 64 if cfg.tiny else 512
    model = _Branchy(width).eval()
    inputs = [torch.randn(64, width) * (0.5 + i % 3) for i in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fmodel = clouseau.instrument(model, select="*", path=None)
        for x in inputs:  # the tier's compile, both branches: per-call cost only
            fmodel(x)

    def ours() -> None:
        for x in inputs:
            fmodel(x)

    def plain() -> None:
        for x in inputs:
            model(x)

    return ours, plain
