"""Scaling: cost against the number of saved points, against depth, and memory against data.

*Points* and *depth* time instrumented PyTorch MLPs (to disk, a flush per call) and check
that time and peak memory grow linearly: the marginal cost per unit over the upper half of
the range must stay within 1.5x of the lower half's (a quadratic would give about 4x on
these doubling series). *Memory* captures many times ``max_size_mb`` of data and checks
that the peak RSS stays below one call's working set plus a small multiple of
``max_size_mb`` and does not grow with the total; each total runs in a fresh interpreter,
since an allocator that kept the freed memory of an earlier run would hide the peak.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from bench.harness import (
    Config,
    Result,
    Variant,
    build,
    peak_rss_mb,
    progress,
    remove_files,
    reset_peak,
    rss_mb,
    run_variants,
    scratch_dir,
    time_once,
    trim_heap,
)
from bench.models_torch import MLP, mlp_case
from bench.report import Check, Report, Table, fmt_mb, fmt_s, fmt_x

SLOPE_LIMIT = 1.5  # upper-half marginal cost / lower-half marginal cost
MEMORY_MULTIPLE = 4  # the writer holds <= 1 buffer + 1 queued + 1 writing file, so 3 suffice


def scaling_points(cfg: Config) -> Report:
    """Time and peak RSS of a 16-layer MLP saving its first k ReLU outputs, k = 0..16.

    Narrow and tall (width 128, batch 4096): each ReLU output is 2 MiB for little compute,
    so the cost of saving stands out of the forward's noise.
    """
    depth, width, batch = (4, 32, 8) if cfg.tiny else (16, 128, 4096)
    counts = [0, 1, 2, 4] if cfg.tiny else [0, 4, 8, 16] if cfg.quick else [0, 1, 2, 4, 8, 16]
    torch.set_grad_enabled(False)
    case = mlp_case(cfg.tiny, depth=depth, width=width)
    case.inputs = (torch.randn(batch, width),)
    mib_each = batch * width * 4 / 2**20
    report = Report(
        name="scaling-points",
        title=f"Scaling with the number of saved points (MLP depth {depth}, width {width}, batch {batch})",
        description=f"The first k ReLU outputs ({mib_each:.2f} MiB each) to disk, a flush per call; "
        "k = 0 is `select=None`.",
        plain="plain forward",
    )
    with scratch_dir(cfg, "points") as d:
        relus = [str(2 * i + 1) for i in range(depth)]  # Sequential names: ReLU i is "2i+1"
        variants = [Variant("plain forward", step=lambda: case.model(*case.inputs))]
        for k in counts:
            select = relus[:k] if k else None
            variants.append(
                build(
                    f"k={k}",
                    lambda s=select, k=k: _disk_variant(case.model, case.inputs, s, d / f"k{k}"),
                )
            )
            variants.append(_floor_variant(case.model, case.inputs, k, d / f"floor{k}"))
        report.results = run_variants(variants, cfg)
    xs = [float(k) for k in counts]
    _scaling_tables(
        report, "k (points)", xs, [f"k={k}" for k in counts], [k * mib_each for k in counts]
    )
    # The machine's own curve: writing k times 2 MiB need not be linear in k (page cache,
    # dirty-page write-back), and no capture can be straighter than the bytes it writes.
    floors = [report.result(f"floor k={k}") for k in counts]
    floor_times = [r.median if r is not None and r.ok else math.nan for r in floors]
    report.tables[-1].note += (
        f" The floor (forward + save_file of k tensors of the same size) has a marginal-cost "
        f"ratio of {slope_ratio(xs, floor_times):.2f}x on this run."
    )
    return report


def _floor_variant(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], k: int, path: Path
) -> Variant:
    from safetensors.torch import save_file

    tensors = {f"relu_{i}": model(*inputs).clone() for i in range(k)}

    def step() -> None:
        model(*inputs)
        if tensors:
            save_file(tensors, str(path))

    return Variant(f"floor k={k}", step=step)


def scaling_depth(cfg: Config) -> Report:
    """Time, peak RSS and first-call cost of MLPs of growing depth, ``select='*'`` to disk."""
    depths = [2, 4, 8] if cfg.tiny else [8, 16, 32] if cfg.quick else [4, 8, 16, 32, 64]
    width, batch = (32, 4) if cfg.tiny else (512, 64)
    torch.set_grad_enabled(False)
    report = Report(
        name="scaling-depth",
        title=f"Scaling with depth (MLP width {width}, batch {batch}, `select='*'` to disk)",
        description="Each depth is its own model; its plain forward is in the table below. The "
        "first call (trace + rewrite + compile + forward) is the median of three fresh "
        "instruments per depth (the process has traced an MLP before, so imports are paid).",
        plain="",
    )
    firsts: dict[int, float] = {}
    with scratch_dir(cfg, "depth") as d:
        variants: list[Variant] = []
        models = {}
        for depth in depths:
            model = MLP(depth, width).eval()
            x = torch.randn(batch, width)
            models[depth] = (model, x)
            variants.append(Variant(f"plain D={depth}", step=lambda m=model, x=x: m(x)))
        _first_call(models[depths[0]][0], models[depths[0]][1], d / "imports")  # pay the imports
        for depth in depths:
            model, x = models[depth]
            # The median of three fresh instruments: one-shot timings are at the mercy of
            # whatever else the machine does in that second.
            firsts[depth] = statistics.median(
                _first_call(model, x, d / f"first{depth}-{i}") for i in range(3)
            )
            variants.append(
                build(
                    f"clouseau D={depth}",
                    lambda m=model, x=x, depth=depth: _disk_variant(m, (x,), "*", d / f"D{depth}"),
                )
            )
        report.results = run_variants(variants, cfg)
    xs = [float(x) for x in depths]
    names = [f"clouseau D={x}" for x in depths]
    _scaling_tables(report, "depth", xs, names, None, plains=[f"plain D={x}" for x in depths])
    rows = [[str(dep), fmt_s(firsts[dep]), fmt_s(firsts[dep] / dep)] for dep in depths]
    report.tables.append(
        Table("First call against depth", ["depth", "first call", "per layer"], rows)
    )
    ys = [firsts[dep] for dep in depths]
    report.checks.append(
        Check(
            "first call grows linearly with depth (upper/lower marginal cost)",
            slope_ratio(xs, ys),
            SLOPE_LIMIT,
            "<=",
        )
    )
    return report


def _first_call(model: torch.nn.Module, x: torch.Tensor, path: Path) -> float:
    try:
        import clouseau

        fmodel = clouseau.instrument(model, select="*", path=path)
        t = time_once(lambda: fmodel(x))
        fmodel.close()
        return t
    except Exception as err:
        progress(f"first call failed: {type(err).__name__}: {err}")
        return math.nan


def _disk_variant(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], select: Any, path: Path
) -> Variant:
    import clouseau

    fmodel = clouseau.instrument(model, select=select, path=path)

    def step() -> None:
        fmodel(*inputs)
        fmodel.flush()

    return Variant("", step=step, after=lambda: remove_files(path), close=fmodel.close)


def _scaling_tables(
    report: Report,
    label: str,
    xs: list[float],
    names: list[str],
    mib: list[float] | None,
    plains: list[str] | None = None,
) -> None:
    """The series table and the two linearity checks (time, peak RSS) of one scaling run."""
    res = [report.result(n) for n in names]
    times = [r.median if r is not None and r.ok else math.nan for r in res]
    peaks = [r.peak if r is not None and r.ok else math.nan for r in res]
    plain_t = [
        (_median(report.result(p)) if plains else _median(report.result(report.plain)))
        for p in (plains or names)
    ]
    rows = []
    for i, x in enumerate(xs):
        row = [
            f"{x:g}",
            fmt_s(times[i]),
            fmt_s(plain_t[i]),
            fmt_x(times[i] / plain_t[i]),
            fmt_mb(peaks[i]),
        ]
        if mib is not None:
            row.insert(1, f"{mib[i]:.1f}")
        rows.append(row)
    header = [label, "time / call", "plain forward", "ratio", "peak RSS growth (MiB)"]
    if mib is not None:
        header.insert(1, "MiB saved / call")
    report.tables.append(
        Table(
            f"Series against {label}",
            header,
            rows,
            note=f"R² of a linear fit: time {r_squared(xs, times):.3f}, peak RSS {r_squared(xs, peaks):.3f}.",
        )
    )
    what = report.name.split("-")[1]
    report.checks.append(
        Check(
            f"time grows linearly with {what} (upper/lower marginal cost)",
            slope_ratio(xs, times),
            SLOPE_LIMIT,
            "<=",
        )
    )
    report.checks.append(
        Check(
            f"peak RSS grows linearly with {what} (upper/lower marginal cost)",
            slope_ratio(xs, peaks),
            SLOPE_LIMIT,
            "<=",
        )
    )


def _median(r: Result | None) -> float:
    return r.median if r is not None and r.ok else math.nan


def slope_ratio(xs: list[float], ys: list[float]) -> float:
    """Marginal cost over the upper half of the series divided by the lower half's.

    1 for a straight line (whatever its intercept), about 4 for a quadratic on a doubling
    series; a flat lower half (all noise) is floored at 5% of the overall slope.
    """
    if len(xs) < 3 or any(math.isnan(y) for y in ys):
        return math.nan
    mid = len(xs) // 2
    lower = (ys[mid] - ys[0]) / (xs[mid] - xs[0])
    upper = (ys[-1] - ys[mid]) / (xs[-1] - xs[mid])
    overall = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
    if overall <= 0:
        return 0.0  # no growth at all: certainly not superlinear
    return upper / max(lower, 0.05 * overall)


def r_squared(xs: list[float], ys: list[float]) -> float:
    """The coefficient of determination of the least-squares line through the points."""
    if len(xs) < 3 or any(math.isnan(y) for y in ys):
        return math.nan
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    syy = sum((y - my) ** 2 for y in ys)
    if syy == 0:
        return 1.0
    return sxy * sxy / (sxx * syy)


# -- memory bounded by max_size_mb ---------------------------------------------------------------
def scaling_memory(cfg: Config) -> Report:
    """Peak RSS while capturing far more than ``max_size_mb``, at two totals and in memory."""
    max_mb = 1 if cfg.tiny else 8
    calls = [2, 8] if cfg.tiny else ([4, 12] if cfg.quick else [8, 32])
    report = Report(
        name="scaling-memory",
        title=f"Peak memory while capturing more than max_size_mb={max_mb}",
        description="An MLP (depth 8, width 1024, batch 256) saves `select='*'` (about 17 MiB a "
        "call) for many calls without flushing: files roll at max_size_mb and are written by "
        "the background thread. Each row is a fresh interpreter. *Working set* is the peak of "
        "one instrumented call keeping its capture in memory (forward plus one call's copies).",
    )
    rows = []
    runs: dict[str, dict[str, float]] = {}
    with scratch_dir(cfg, "memory") as d:
        plan = [("working set", 1, None), *((f"{n} calls to disk", n, max_mb) for n in calls)]
        plan.append((f"{calls[-1]} calls in memory", calls[-1], None))
        for label, n, mb in plan:
            progress(f"memory run: {label}")
            run = _memory_subprocess(n, mb, d / label.replace(" ", "-"), cfg.tiny)
            runs[label] = run
            rows.append(
                [
                    label,
                    f"{run.get('total_mb', math.nan):.0f}",
                    fmt_mb(run.get("peak_mb", math.nan)),
                    fmt_s(run.get("seconds", math.nan)),
                    run.get("error", ""),
                ]
            )
    report.tables.append(
        Table(
            "Peak RSS growth",
            ["run", "MiB captured", "peak RSS growth (MiB)", "time", "note"],
            rows,
        )
    )
    working = runs["working set"].get("peak_mb", math.nan)
    small, large = (runs[f"{n} calls to disk"].get("peak_mb", math.nan) for n in calls)
    bound = working + MEMORY_MULTIPLE * max_mb
    report.checks.append(
        Check(
            f"peak RSS capturing {calls[-1]} calls <= working set + {MEMORY_MULTIPLE} x max_size_mb ({bound:.0f} MiB)",
            large,
            bound,
            "<=",
            " MiB",
        )
    )
    extra = (calls[-1] - calls[0]) * runs["working set"].get("total_mb", math.nan)
    report.checks.append(
        Check(
            f"peak RSS does not grow with the total: {calls[-1]} calls vs {calls[0]}, growth "
            f"<= 10% of the {extra:.0f} MiB more captured",
            large - small,
            0.1 * extra,
            "<=",
            " MiB",
        )
    )
    return report


def _memory_subprocess(calls: int, max_mb: float | None, path: Path, tiny: bool) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "bench.bench_scaling",
        json.dumps({"calls": calls, "max_mb": max_mb, "path": str(path), "tiny": tiny}),
    ]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=300)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"}


def _memory_run(calls: int, max_mb: float | None, path: str, tiny: bool) -> dict[str, Any]:
    """In a fresh interpreter: capture ``calls`` calls; report the peak RSS growth.

    ``max_mb=None`` keeps the capture in memory (one call of that is the working set).
    """
    import clouseau

    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    depth, width, batch = (2, 64, 16) if tiny else (8, 1024, 256)
    model = MLP(depth, width).eval()
    x = torch.randn(batch, width)
    # The trace, the first allocations and the imports are not what this measures: one
    # call through a throwaway instrumented model pays them before the baseline is taken.
    with clouseau.instrument(model, select="*", path=None) as warm:
        warm(x)
        total_mb = (
            sum(warm.captured.get(r.name, call=r.call).nbytes for r in warm.captured.records)
            / 2**20
            * calls
        )
    del warm
    fmodel = clouseau.instrument(
        model, select="*", path=None if max_mb is None else path, max_size_mb=max_mb or 1024
    )
    fmodel.trace(x)

    def capture_all() -> None:
        for _ in range(calls):
            fmodel(x)
        fmodel.close()  # the last files are written before the peak is read

    # Hand the warm-up's freed memory back first: reused, it would hide the run's peak.
    gc.collect()
    trim_heap()
    reset_peak()
    base = rss_mb()
    t = time_once(capture_all)
    return {"peak_mb": peak_rss_mb() - base, "total_mb": total_mb, "seconds": t}


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    try:
        out = _memory_run(spec["calls"], spec["max_mb"], spec["path"], spec["tiny"])
    except Exception as err:
        out = {"error": f"{type(err).__name__}: {err}"}
    print(json.dumps(out))
