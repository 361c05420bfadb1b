"""Canonical names and computed attention patterns (issue 29): what they cost.

Rows are ratios of two wall times taken in one process, interleaved over repetitions
(median of the ratios), on one GPT-2 built twice from one set of weights: with SDPA and
with the eager attention implementation.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

import clouseau
from bench.bench_workloads import Step, _gpt2, _ratio
from bench.harness import Config
from bench.report import Check, Report, Table, fmt_s


def canonical_costs(cfg: Config) -> Report:
    """A pattern beside SDPA vs eager attention's own; canonical names vs module paths."""
    torch.set_grad_enabled(False)
    report = Report(
        name="torch-canonical",
        title="PyTorch: canonical names and attention patterns beside a fused kernel",
        description="Ratios of wall times in one process, interleaved; median over "
        "repetitions. Each instrumented model has traced before the timing starts.",
    )
    reps = max(3, cfg.reps // 2)
    sdpa, eager, ids = _models(cfg)
    rows: list[list[str]] = []
    for label, limit, pair in (
        ("every block's attention pattern computed beside SDPA vs the eager attention "
         "implementation saving its own pattern", 1.0, _patterns(sdpa, eager, ids)),
        ("every block's output selected by canonical name (blocks.*.resid_post) vs by "
         "module path", 1.1, _names(sdpa, ids)),
        # No target: why the first row can miss one on a CPU, whose fused kernel may cost
        # more than the whole eager attention (a GPU's costs a fraction of it).
        ("the plain SDPA model vs the plain eager-attention model (nothing captured)", None,
         _plain(sdpa, eager, ids)),
    ):  # fmt: skip
        ratio, ours, base = _ratio(*pair, reps=reps)
        rows.append([label, fmt_s(base), fmt_s(ours), f"{ratio:.3g}x"])
        if limit is not None:
            report.checks.append(Check(label, ratio, limit, "<="))
    report.tables.append(
        Table(
            "Medians (seconds) and the median ratio", ["row", "baseline", "clouseau", "ratio"], rows
        )
    )
    return report


def _models(cfg: Config) -> tuple[Any, Any, torch.Tensor]:
    sdpa = _gpt2(2 if cfg.tiny else 4, 64 if cfg.tiny else 256)
    eager = copy.deepcopy(sdpa)
    eager.set_attn_implementation("eager")
    ids = torch.randint(2, 1000, (4, 32 if cfg.tiny else 256))
    return sdpa, eager, ids


def _patterns(sdpa: Any, eager: Any, ids: torch.Tensor) -> tuple[Step, Step]:
    ours = clouseau.instrument(sdpa, select="blocks.*.attn.pattern", path=None)
    theirs = clouseau.instrument(eager, select="blocks.*.attn.pattern", path=None)
    ours(ids, use_cache=False)
    theirs(ids, use_cache=False)
    return (lambda: ours(ids, use_cache=False)), (lambda: theirs(ids, use_cache=False))


def _plain(sdpa: Any, eager: Any, ids: torch.Tensor) -> tuple[Step, Step]:
    return (lambda: sdpa(ids, use_cache=False)), (lambda: eager(ids, use_cache=False))


def _names(model: Any, ids: torch.Tensor) -> tuple[Step, Step]:
    paths = [f"transformer.h.{i}" for i in range(model.config.n_layer)]
    canonical = clouseau.instrument(model, select="blocks.*.resid_post", path=None)
    by_path = clouseau.instrument(model, select=paths, path=None)
    canonical(ids, use_cache=False)
    by_path(ids, use_cache=False)
    return (lambda: canonical(ids, use_cache=False)), (lambda: by_path(ids, use_cache=False))
