"""clouseau's own cost per call, in microseconds, where the forward pass costs almost nothing.

On the models of the issue a forward takes milliseconds, so a fixed cost of tens of
microseconds per call (the signature lookup, the trace lock, argument binding, the sink's
bookkeeping) drowns in the noise of a 2-core machine. Here the model is tiny (one
Linear(8, 8) + ReLU on one row: a forward of some 20 µs), so the difference of medians
*is* the fixed cost. A second model, 64 x (Linear 16 + ReLU), shows the cost per module
call: the traced graph calls 128 modules where ``nn.Sequential`` iterates them.

No target: the ratios to the plain forward mean little for a 20 µs forward; the numbers
explain the ``select=None`` ratio of the real models (fixed cost / their forward).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from bench.bench_torch import clear_memory
from bench.harness import Config, Result, Variant, build, run_variants
from bench.report import Report, Table, fmt_s

PLAIN = "plain forward"
NONE = "clouseau select=None"
ACT_MEM = "clouseau relu* -> memory"
ALL_MEM = "clouseau * -> memory"


def per_call_overhead(cfg: Config) -> Report:
    """Fixed cost per call of an instrumented module, on a tiny and on a deep narrow MLP."""
    torch.set_grad_enabled(False)
    report = Report(
        name="torch-overhead",
        title="PyTorch: clouseau's fixed cost per call (tiny models)",
        description="One Linear(8, 8) + ReLU on a 1x8 input: the difference to the plain "
        "forward is clouseau's own cost per call. In-memory variants keep the capture of "
        "each sample, then drop it untimed.",
        plain=PLAIN,
    )
    # Samples of some 4 ms (200 steps) are short: more repetitions make up for it.
    reps = cfg.reps * (1 if cfg.tiny else 3)
    tiny = _model(1, 8)
    report.results = run_variants(_variants(tiny, torch.randn(1, 8)), cfg, reps=reps)
    depth = 4 if cfg.tiny else 64
    deep = _model(depth, 16)
    deep_results = run_variants(_variants(deep, torch.randn(1, 16))[:2], cfg, reps=reps)
    rows = [
        _row("Linear(8, 8) + ReLU (2 modules)", report.results),
        _row(f"{depth} x (Linear(16, 16) + ReLU) ({2 * depth} modules)", deep_results),
    ]
    report.tables.append(
        Table(
            "Fixed cost per call: median of the variant minus median of the plain forward",
            [
                "model",
                "plain forward",
                "select=None: wall",
                "select=None: CPU",
                "relu* -> memory: wall",
                "* -> memory: wall",
            ],
            rows,
        )
    )
    return report


def _model(depth: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers).eval()


def _variants(model: nn.Module, x: torch.Tensor) -> list[Variant]:
    return [
        Variant(PLAIN, step=lambda: model(x)),
        build(NONE, lambda: _instrumented(model, x, None)),
        build(ACT_MEM, lambda: _instrumented(model, x, "relu*")),
        build(ALL_MEM, lambda: _instrumented(model, x, "*")),
    ]


def _instrumented(model: nn.Module, x: torch.Tensor, select: Any) -> Variant:
    import clouseau

    fmodel = clouseau.instrument(model, select=select, path=None)
    return Variant(
        "", step=lambda: fmodel(x), after=lambda: clear_memory(fmodel), close=fmodel.close
    )


def _row(label: str, results: list[Result]) -> list[str]:
    by_name = {r.name: r for r in results}
    plain = by_name[PLAIN]

    def over(name: str, cpu: bool = False) -> str:
        r = by_name.get(name)
        if r is None or not r.ok or not plain.ok:
            return "—"
        cost = r.cpu_median - plain.cpu_median if cpu else r.median - plain.median
        return "—" if math.isnan(cost) else f"{cost * 1e6:+.1f} µs"

    return [
        label,
        fmt_s(plain.median) if plain.ok else "—",
        over(NONE),
        over(NONE, cpu=True),
        over(ACT_MEM),
        over(ALL_MEM),
    ]
