"""``python -m bench`` (``./dev.sh bench``): run the benchmarks and write bench/RESULTS.md.

    python -m bench                 every comparison (about 10 minutes on 2 cores)
    python -m bench --quick         fewer repetitions (under 2 minutes)
    python -m bench torch-* jax-mlp only the comparisons matching these globs
    python -m bench --list          the comparisons

Each comparison runs in a subprocess of its own (``--worker``), so one model's allocator
state, thread pools, JIT caches or TorchLens's global wrappers never colour another's
numbers, and a crash or hang costs one section of the report, not the run. A benchmark
never fails: the exit status is 0 whatever the targets say; the numbers are the output.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Config, dump, machine, versions
from bench.report import Report, fmt_s, free_table, variant_table, verdict

# name -> (module, function, argument). Order is the order of RESULTS.md.
COMPARISONS: dict[str, tuple[str, str, str]] = {
    "torch-mlp": ("bench.bench_torch", "compare_model", "mlp"),
    "torch-cnn": ("bench.bench_torch", "compare_model", "cnn"),
    "torch-gpt": ("bench.bench_torch", "compare_model", "gpt"),
    "torch-overhead": ("bench.bench_overhead", "per_call_overhead", ""),
    "torch-workloads": ("bench.bench_workloads", "real_workloads", ""),
    "torch-canonical": ("bench.bench_canonical", "canonical_costs", ""),
    "torchlens-mlp": ("bench.bench_torch", "compare_torchlens", "mlp"),
    "torchlens-cnn": ("bench.bench_torch", "compare_torchlens", "cnn"),
    "jax-mlp": ("bench.bench_jax", "compare_model", "mlp"),
    "jax-block": ("bench.bench_jax", "compare_model", "block"),
    "scaling-points": ("bench.bench_scaling", "scaling_points", ""),
    "scaling-depth": ("bench.bench_scaling", "scaling_depth", ""),
    "scaling-memory": ("bench.bench_scaling", "scaling_memory", ""),
    "dataset-record": ("bench.bench_dataset", "record_vs_floor", ""),
    "dataset-read": ("bench.bench_dataset", "read_throughput", ""),
    "dataset-arrow": ("bench.bench_dataset", "versus_arrow", ""),
    "dataset-memory": ("bench.bench_dataset", "peak_memory", ""),
    "load-files": ("bench.bench_load", "load_scaling", ""),
    "dist-torchrun": ("bench.bench_distributed", "torchrun_scaling", ""),
    "dist-upload": ("bench.bench_distributed", "upload_vs_disk", ""),
    "dist-ray-overhead": ("bench.bench_distributed", "ray_overhead", ""),
    "peers-memory": ("bench.bench_peers", "memory", ""),
    "peers-disk": ("bench.bench_peers", "disk", ""),
    "peers-generate": ("bench.bench_peers", "generate", ""),
    "peers-generate-families": ("bench.bench_generate", "families", ""),
    "peers-overhead": ("bench.bench_peers_extra", "overhead", ""),
    "peers-dataset": ("bench.bench_peers_extra", "dataset", ""),
    "peers-torchlens": ("bench.bench_peers_extra", "torchlens", ""),
}

DEFAULT_OUT = Path(__file__).resolve().parent / "RESULTS.md"


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the chosen comparisons, write the report."""
    args = _parser().parse_args(argv)
    if args.worker:
        return _worker(args.worker, Config.from_json(json.loads(args.config)), Path(args.json_out))
    if args.list:
        for name, (module, func, arg) in COMPARISONS.items():
            print(f"{name:16} {module}.{func}({arg!r})")
        return 0
    chosen = _select(args.names)
    if not chosen:
        print(f"no comparison matches {args.names}; see --list", file=sys.stderr)
        return 2
    cfg = Config.make(
        args.quick, args.tiny, Path(args.workdir) if args.workdir else None, args.threads
    )
    started = time.perf_counter()
    load_before = _loadavg()
    reports = []
    for name in chosen:
        print(f"==> {name}", flush=True)
        report = run_comparison(name, cfg, timeout=args.timeout or (300 if cfg.quick else 600))
        reports.append(report)
        _print_summary(report)
    out = Path(args.out) if args.out else DEFAULT_OUT
    text = render(
        reports,
        cfg,
        argv if argv is not None else sys.argv[1:],
        time.perf_counter() - started,
        load_before,
    )
    if any(r.name.startswith("peers-") for r in reports):
        from bench.bench_peers import plot

        drawn = plot(reports, out.parent / "peers.png")
        print(drawn)
        text += f"\n{drawn}.\n"
    out.write_text(text)
    print(f"wrote {out} ({time.perf_counter() - started:.0f} s)")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "names", nargs="*", help="globs of comparisons to run (default: all; see --list)"
    )
    p.add_argument("--quick", action="store_true", help="fewer repetitions: under 2 minutes")
    p.add_argument(
        "--tiny", action="store_true", help="tiny models (the smoke test); numbers mean nothing"
    )
    p.add_argument("--list", action="store_true", help="list the comparisons and exit")
    p.add_argument("--out", help=f"the report to write (default {DEFAULT_OUT})")
    p.add_argument("--workdir", help="where capture files are written (default: the temp dir)")
    p.add_argument("--timeout", type=float, help="seconds one comparison may take")
    p.add_argument(
        "--threads",
        type=int,
        help="intra-op threads for torch and XLA (default: every core; 1 gives steadier "
        "numbers on a busy machine)",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--json-out", help=argparse.SUPPRESS)
    return p


def _select(globs: list[str]) -> list[str]:
    if not globs:
        return list(COMPARISONS)
    return [n for n in COMPARISONS if any(fnmatch.fnmatchcase(n, g) for g in globs)]


def run_comparison(name: str, cfg: Config, timeout: float) -> Report:
    """Run one comparison in a fresh interpreter and read back its Report."""
    with tempfile.TemporaryDirectory(prefix="clouseau-bench-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "bench",
            "--worker",
            name,
            "--config",
            json.dumps(cfg.to_json()),
            "--json-out",
            str(out),
        ]
        started = time.perf_counter()
        try:
            # stderr passes through: the worker's progress lines and any traceback show live.
            # The thread caps (--threads) must be in the environment before torch or jax
            # is imported, so the worker gets them from its parent.
            proc = subprocess.run(
                cmd,
                stdout=subprocess.PIPE,
                text=True,
                timeout=timeout,
                cwd=_repo_root(),
                env={**os.environ, **cfg.thread_env()},
            )
        except subprocess.TimeoutExpired:
            return Report(
                name,
                name,
                error=f"timed out after {timeout:.0f} s",
                seconds=time.perf_counter() - started,
            )
        if proc.returncode != 0 or not out.exists():
            return Report(
                name,
                name,
                error=f"the worker exited with {proc.returncode} (its traceback is above)",
                seconds=time.perf_counter() - started,
            )
        report = Report.from_json(json.loads(out.read_text()))
        report.seconds = time.perf_counter() - started
        return report


def _worker(name: str, cfg: Config, out: Path) -> int:
    module, func, arg = COMPARISONS[name]
    try:
        fn = getattr(importlib.import_module(module), func)
        report: Report = fn(arg, cfg) if arg else fn(cfg)
    except Exception as err:
        import traceback

        traceback.print_exc()
        report = Report(name, name, error=f"{type(err).__name__}: {err}")
    dump(out, report.to_json())
    return 0


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _busy(load_before: str) -> str:
    """A warning when other processes competed for the cores during the run."""
    try:
        load = max(float(load_before.split()[0]), os.getloadavg()[0])
    except (ValueError, IndexError, OSError):
        return ""
    cores = os.cpu_count() or 1
    if load < 0.5 * cores:
        return ""
    return (
        f"the machine was busy (load average up to {load:.1f} on {cores} cores): other "
        "processes took CPU time during the run, so medians are inflated and ratios noisy. "
        "Rerun on an idle machine; `--threads 1` keeps thread pools from stalling on "
        "descheduled workers meanwhile."
    )


def _print_summary(report: Report) -> None:
    if report.error:
        print(f"    error: {report.error}")
    for r in report.results:
        state = (
            f"{fmt_s(r.median)}"
            if r.ok
            else (f"skipped: {r.skip}" if r.skip else f"failed: {r.error}")
        )
        print(f"    {r.name:38} {state}")
    for c in report.checks:
        print(f"    target: {c.target}: {c.measured:.3g}{c.unit} -> {verdict(c)}")


def render(
    reports: list[Report], cfg: Config, argv: list[str], seconds: float, load_before: str
) -> str:
    """The whole RESULTS.md."""
    mode = "tiny (smoke test)" if cfg.tiny else "quick" if cfg.quick else "full"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# clouseau benchmarks",
        "",
        f"Generated by `./dev.sh bench {' '.join(argv)}`".rstrip() + f" on {now}: {mode} mode, "
        f"{cfg.reps} interleaved repetitions after {cfg.warmup} warm-up(s), {seconds:.0f} s in all. "
        "Do not edit: rerun the command. docs/performance.md explains the method and the numbers.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in machine().items()]
    threads = str(cfg.threads) if cfg.threads > 0 else f"{os.cpu_count()} (every core)"
    lines += [
        f"| intra-op threads (torch, XLA) | {threads} |",
        f"| load average before / after | {load_before} / {_loadavg()} |",
        "",
    ]
    busy = _busy(load_before)
    if busy:
        lines += [f"> **Warning:** {busy}", ""]
    lines += ["## Versions", "", "| package | version |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in versions().items()]
    lines += [
        "",
        "## Targets",
        "",
        "| target | measured | limit | verdict |",
        "|---|---:|---:|---|",
    ]
    for r in reports:
        for c in r.checks:
            measured = "—" if c.met is None else f"{c.measured:.3g}{c.unit}"
            lines.append(f"| {c.target} | {measured} | {c.op} {c.limit:g}{c.unit} | {verdict(c)} |")
    for r in reports:
        lines += ["", f"## {r.title} (`{r.name}`)", ""]
        if r.description:
            lines += [r.description, ""]
        if r.error:
            lines += [f"**Did not complete:** {r.error}", ""]
        if r.results:
            lines += [*variant_table(r), ""]
        for t in r.tables:
            lines += [f"**{t.title}**", "", *free_table(t), ""]
            if t.note:
                lines += [t.note, ""]
        lines.append(f"_{r.seconds:.0f} s_")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
