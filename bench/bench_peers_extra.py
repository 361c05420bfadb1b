"""More peers (bench/bench_peers.py): per-call overhead, an activation dataset, TorchLens."""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from bench import peers_tools as pt
from bench.bench_peers import (
    CLOUSEAU,
    HOOKS,
    NNSIGHT,
    PLAIN,
    TORCHLENS,
    Case,
    Lazy,
    clouseau_variant,
    verified,
)
from bench.bench_torch import clear_memory
from bench.harness import Config, Result, Variant, build, progress, run_variants, scratch_dir
from bench.report import Check, Report, Table


# -- per-call overhead on a tiny model ---------------------------------------------------------
class Block(torch.nn.Module):
    """Linear(8, 8), then a ReLU module."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.act = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Tiny(torch.nn.Module):
    """A :class:`Block`, then tanh: ``block.fc`` and ``block.act`` are module outputs (the
    hook path: a glob with a dot names module outputs only, while a dotless ``"fc"`` could
    also name an op, so it is traced), ``tanh`` is an op (the traced path)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.block(x))


HOOK_PATH = "clouseau hook path (block.fc, block.act)"
TRACED = "clouseau traced path (block.fc, tanh)"
NONE = "clouseau select=None"


def overhead(cfg: Config) -> Report:
    """The fixed cost per call of saving 2 points of a tiny MLP, per tool."""
    torch.set_num_threads(max(1, cfg.threads))
    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    model, x = Tiny().eval(), torch.randn(1, 8)
    report = Report(
        name="peers-overhead",
        title="Per-call overhead: 2 points of a tiny MLP (Linear(8, 8) + ReLU + tanh, 1x8)",
        description="The forward costs some 20 µs, so a variant's median minus the plain "
        "forward's is the tool's own cost per call; the targets use CPU time, which a busy "
        "machine inflates far less than wall time. Raw hooks are registered once and clone "
        "each output; every tool runs on its own copy of the model. The TransformerBridge "
        "wraps transformer architectures only, so it has no row here.",
        plain=PLAIN,
    )
    fc = model.block.fc(x)
    ref = {"block.fc": fc, "block.act": torch.relu(fc)}
    ref_traced = {"block.fc": fc, "tanh": model(x)}

    def twin() -> torch.nn.Module:
        return copy.deepcopy(model)

    def instrumented(select: Any) -> Variant:
        import clouseau

        fmodel = clouseau.instrument(twin(), select=select, path=None)
        fmodel(x)  # the trace: the warm-up must size its samples on the steady state
        clear_memory(fmodel)
        return Variant(
            "",
            step=lambda: (fmodel(x), Lazy(lambda n: fmodel.captured[n]))[1],
            after=lambda: clear_memory(fmodel),
            close=fmodel.close,
        )

    hooked = twin()
    variants = [
        Variant(PLAIN, step=lambda: model(x)),
        verified(pt.hooks_variant(HOOKS, lambda: hooked(x), hooked, [*ref]), ref),
        verified(pt.nnsight_variant(NNSIGHT, twin(), (x,), [*ref]), ref),
        verified(build(HOOK_PATH, lambda: instrumented([*ref])), ref),
        verified(build(TRACED, lambda: instrumented([*ref_traced])), ref_traced),
        build(NONE, lambda: instrumented(None)),
    ]
    # Samples of a few ms (200 steps) are short: more repetitions make up for it.
    # The last warm-up step sizes a variant's samples: one slow step (the machine is shared)
    # would make them single calls, which run cold after the collection before each sample.
    warm = dataclasses.replace(cfg, warmup=max(cfg.warmup, 5))
    report.results = run_variants(variants, warm, reps=cfg.reps * (1 if cfg.tiny else 3))
    plain = report.result(PLAIN)

    def cost(name: str, cpu: bool = True) -> float:
        # CPU time by default: a single-threaded call of tens of µs is all CPU, and the
        # wall time of such a call on a shared machine is mostly other processes' slices.
        r = report.result(name)
        if r is None or not r.ok or plain is None or not plain.ok:
            return math.nan
        return r.cpu_median - plain.cpu_median if cpu else r.median - plain.median

    rows = [
        [
            r.name,
            f"{cost(r.name) * 1e6:+.1f} µs",
            f"{cost(r.name, cpu=False) * 1e6:+.1f} µs",
            f"{cost(r.name) / cost(HOOKS):.2f}x",
        ]
        for r in report.results
        if r.ok and r.name != PLAIN
    ]
    report.tables.append(
        Table(
            "Cost per call beyond the plain forward (medians of CPU time, and of wall time)",
            ["variant", "CPU / call", "wall / call", "CPU cost vs raw hooks"],
            rows,
        )
    )
    for name, limit in ((HOOK_PATH, 1.5), (TRACED, 2.0)):
        report.checks.append(
            Check(
                f"overhead (CPU): {name} / raw hooks (clone)", cost(name) / cost(HOOKS), limit, "<="
            )
        )
    report.checks.append(
        Check(f"overhead (CPU): {HOOK_PATH} / nnsight", cost(HOOK_PATH) / cost(NNSIGHT), 1.0, "<=")
    )
    return report


# -- an activation dataset to disk -------------------------------------------------------------
def dataset(cfg: Config) -> Report:
    """clouseau.record of 200 batches against hooks + save_file per batch, five runs."""

    from safetensors.torch import save_file

    import clouseau

    case = Case(cfg, batch=(2, 64))
    n = 10 if cfg.tiny else 50 if cfg.quick else 200
    batches = [
        torch.randint(2, 1000, tuple(case.ids.shape), generator=torch.Generator().manual_seed(k))
        for k in range(n)
    ]
    report = Report(
        name="peers-dataset",
        title=f"An activation dataset: {n} batches to disk ({case.shape.split(',')[0]}, batch 2x64)",
        description="`clouseau.record(model, batches, select=<the 12 module outputs>, path=...)` "
        "against forward hooks that clone + `safetensors.torch.save_file` of one file per "
        "batch (the floor). Each run is whole (from its first batch to its files closed); "
        "the runs alternate, and each ratio is of one record run to the floor run beside it. "
        "Batches of 2x64 keep 200 of them to seconds on a shared machine.",
        plain="floor",
    )
    model = case.twin()[0]
    hooks = pt.Hooks(model, case.names)
    runs = 2 if cfg.tiny else 5

    def floor(out: Path) -> None:
        for k, ids in enumerate(batches):
            model(ids)
            save_file(dict(hooks.take()), str(out / f"batch-{k:05d}.safetensors"))

    def record(out: Path) -> None:
        clouseau.record(
            case.model, batches, select=case.names, path=out, progress=False, max_size_mb=64
        )

    ratios, times = [], {"floor": [], "record": []}
    with scratch_dir(cfg, "peers-dataset") as d:
        record(d / "warm")  # the first trace of clouseau: every run below traces afresh anyway
        cap = clouseau.load(d / "warm")
        last = max(r.call for r in cap.records)
        hooks.take()
        model(batches[-1])
        want = dict(hooks.take())
        for name, value in want.items():
            if not torch.equal(torch.as_tensor(cap.get(name, call=last)), value):
                report.error = f"record's {name} of the last batch differs from forward hooks"
                return report
        for run in range(runs):
            pair = {}
            for name, fn in (
                (("floor", floor), ("record", record))
                if run % 2 == 0
                else (("record", record), ("floor", floor))
            ):
                out = d / name
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                t0 = time.perf_counter()
                fn(out)
                pair[name] = time.perf_counter() - t0
                times[name].append(pair[name] / n)
            ratios.append(pair["record"] / pair["floor"])
            progress(f"run {run + 1}/{runs}: record / floor {ratios[-1]:.3f}")
    hooks.close()
    report.results = [Result(k, times=v) for k, v in times.items()]
    report.baselines = {"record": "floor"}
    report.tables.append(
        Table(
            "record / floor, run by run",
            ["run", "ratio"],
            [[str(i + 1), f"{r:.3f}x"] for i, r in enumerate(ratios)],
        )
    )
    report.checks.append(
        Check(f"dataset: record / floor, worst of {runs} runs", max(ratios), 1.1, "<=")
    )
    return report


# -- TorchLens, in a process of its own ----------------------------------------------------------
def torchlens(cfg: Config) -> Report:
    """TorchLens' module outputs and save-all against clouseau in memory, same process."""
    case = Case(cfg)
    report = Report(
        name="peers-torchlens",
        title=f"Peers: TorchLens ({case.shape})",
        description="TorchLens wraps every torch function on its first use and leaves the "
        "wrappers in place, so here the plain forward and clouseau run under the same "
        "wrappers as TorchLens (a process of its own).",
        plain=PLAIN,
    )
    why = pt.missing("torchlens")
    if why:
        report.error = why
        return report
    variants = [
        Variant(PLAIN, step=case.run),
        verified(
            build("12 modules: " + CLOUSEAU, lambda: clouseau_variant("", case, case.names)),
            case.ref,
        ),
        verified(
            pt.torchlens_variant(
                "12 modules: " + TORCHLENS, case.twin()[0], (case.ids,), case.names
            ),
            case.ref,
        ),
        verified(
            build("every point: " + CLOUSEAU, lambda: clouseau_variant("", case, "*")), case.ref
        ),
        pt.torchlens_variant("every point: " + TORCHLENS, case.twin()[0], (case.ids,), None),
    ]
    # TorchLens takes seconds a call: fewer repetitions keep the run short.
    report.results = run_variants(variants, cfg, reps=min(cfg.reps, 3))
    for what in ("12 modules: ", "every point: "):
        report.baselines[what + TORCHLENS] = what + CLOUSEAU
        report.checks.append(
            Check(
                f"{what}TorchLens / clouseau",
                report.ratio(what + TORCHLENS, what + CLOUSEAU),
                10.0,
                ">=",
            )
        )
    return report
