"""Activation datasets (``clouseau.record``): recording, reading back, Arrow, memory.

*Record* times ``clouseau.record`` of two GPT-2 blocks over token batches against the floor:
the same eager forward passes with forward hooks plus ``safetensors.torch.save_file`` of the
same tensors, one file per batch. Both are timed from the second batch to the end, so the
one-off trace of the first batch (shown apart) is not counted. *Read* times
``cap.iter_batches`` over every row, in order and shuffled, against ``numpy.fromfile`` of
the capture's files (the same bytes). *Arrow* compares the token-level recording and a
shuffled read with the Hugging Face path (``datasets.Dataset.from_generator`` +
``save_to_disk``, then ``shuffle`` and ``iter``). *Memory* records 100 and 1,000 batches in
fresh interpreters and compares their peak RSS.
"""

from __future__ import annotations

import importlib
import json
import math
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import clouseau
from bench.harness import Config, Result, Variant, progress, run_variants, scratch_dir
from bench.report import Check, Report, Table, fmt_mb, fmt_s

BLOCKS = ("h.1", "h.3")


def _gpt2(tiny: bool) -> torch.nn.Module:
    # torchvision's schemas beside CPU torch must exist before transformers imports it.
    importlib.import_module("tests.conftest")
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    width, layers = (32, 4) if tiny else (256, 4)
    config = GPT2Config(
        n_layer=layers, n_embd=width, n_head=4, vocab_size=1000, n_positions=128,
        use_cache=False, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2Model(config).eval()


def _tokens(batches: int, batch: int, seq: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(batches):
        lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        out.append(
            {"input_ids": torch.randint(1, 1000, (batch, seq), generator=g), "attention_mask": mask}
        )
    return out


class _FromSecond:
    """The batches, noting when the second is asked for (the first has traced by then)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches, self.t1 = batches, math.nan

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for k, batch in enumerate(self.batches):
            if k == 1:
                self.t1 = time.perf_counter()
            yield batch


def _floor(model: torch.nn.Module, data: _FromSecond, out: Path, rows: bool) -> None:
    from safetensors.torch import save_file

    saved: dict[str, torch.Tensor] = {}
    hooks = [
        model.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: saved.__setitem__(name, o[0] if isinstance(o, tuple) else o)
        )
        for name in BLOCKS
    ]
    try:
        with torch.no_grad():
            for k, batch in enumerate(data):
                model(**batch)
                tensors = dict(saved)
                if rows:
                    keep = batch["attention_mask"].reshape(-1).bool()
                    tensors = {n: t.reshape(-1, t.shape[-1])[keep] for n, t in tensors.items()}
                    tensors["input_ids"] = batch["input_ids"].reshape(-1)[keep]
                save_file(
                    {n: t.contiguous() for n, t in tensors.items()},
                    out / f"batch-{k:05d}.safetensors",
                )
    finally:
        for hook in hooks:
            hook.remove()


def _record(model: torch.nn.Module, data: _FromSecond, out: Path, rows: bool) -> Any:
    options: dict[str, Any] = {"rows": True, "mask": "attention_mask", "fields": ["input_ids"]}
    return clouseau.record(
        model, data, select=list(BLOCKS), path=out, progress=False, max_size_mb=64,
        **(options if rows else {}),
    )  # fmt: skip


def _timed_runs(
    fn: Any, model: torch.nn.Module, batches: list[Any], out: Path, rows: bool
) -> float:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    data = _FromSecond(batches)
    fn(model, data, out, rows)
    return time.perf_counter() - data.t1


def record_vs_floor(cfg: Config) -> Report:
    """clouseau.record vs hooks + save_file, per batch after the first."""
    torch.set_grad_enabled(False)
    model = _gpt2(cfg.tiny)
    n, b, s = (4, 2, 16) if cfg.tiny else (12, 16, 128) if cfg.quick else (16, 16, 128)
    batches = _tokens(n, b, s)
    report = Report(
        name="dataset-record",
        title=f"clouseau.record vs the floor (GPT-2 4x{model.config.n_embd}, {n} batches of {b}x{s} tokens)",
        description="Two blocks' residual stream, as `[batch, seq, d]` and as token rows "
        "(padding dropped, token ids kept). The floor is the eager model with forward hooks "
        "and `safetensors.torch.save_file` of the same tensors, one file per batch. Times "
        "run from the second batch to the end of the run (files closed).",
    )
    times: dict[str, list[float]] = {}
    with scratch_dir(cfg, "record") as d:
        started = time.perf_counter()
        _record(model, _FromSecond(batches[:1]), d / "trace", False)
        trace_s = time.perf_counter() - started
        reps = min(cfg.reps, 5)  # a rep is four whole runs
        for rep in range(reps):
            for rows in (False, True):
                tag = " (rows)" if rows else ""
                for name, fn in (("floor" + tag, _floor), ("record" + tag, _record)):
                    t = _timed_runs(fn, model, batches, d / name.replace(" ", ""), rows)
                    times.setdefault(name, []).append(t / (n - 1))
            progress(f"rep {rep + 1}/{reps}")
    report.results = [Result(name, times=ts) for name, ts in times.items()]
    report.baselines = {"record": "floor", "record (rows)": "floor (rows)"}
    report.plain = "floor"
    report.tables.append(
        Table("First batch", ["what", "time"], [["record: trace and first batch", fmt_s(trace_s)]])
    )
    for suffix in ("", " (rows)"):
        report.checks.append(
            Check(
                f"record{suffix} / floor{suffix} (per batch)",
                report.ratio("record" + suffix, "floor" + suffix),
                1.1,
                "<=",
            )
        )
    return report


def _linear_capture(d: Path, batches: int, rows: int, width: int) -> Any:
    model = torch.nn.Sequential(torch.nn.Linear(width, width))
    g = torch.Generator().manual_seed(0)
    data = [torch.randn(rows, width, generator=g) for _ in range(batches)]
    return clouseau.record(model, data, select="0", path=d, progress=False, max_size_mb=64)


def read_throughput(cfg: Config) -> Report:
    """iter_batches in order and shuffled vs numpy.fromfile of the same files."""
    torch.set_grad_enabled(False)
    batches, rows, width = (4, 64, 32) if cfg.tiny else (48, 2048, 512)
    report = Report(
        name="dataset-read",
        title=f"Reading rows back ({batches * rows:,} rows of {width} float32)",
        description="`cap.iter_batches('0', 4096)` over every row, from the page cache, against "
        "`numpy.fromfile` of the capture's files (every byte of them). Throughput in MB/s of "
        "row data; the ratios are the targets.",
        plain="numpy.fromfile",
    )
    with scratch_dir(cfg, "read") as d:
        cap = _linear_capture(d / "cap", batches, rows, width)
        files = sorted((d / "cap").glob("*.safetensors"))
        seeds = iter(range(10**6))
        variants = [
            Variant("numpy.fromfile", step=lambda: [np.fromfile(f, dtype=np.uint8) for f in files]),
            Variant("iter_batches sequential", step=lambda: _drain(cap.iter_batches("0", 4096, shuffle=False))),
            Variant("iter_batches shuffled", step=lambda: _drain(cap.iter_batches("0", 4096, seed=next(seeds)))),
        ]  # fmt: skip
        report.results = run_variants(variants, cfg)
        file_bytes = sum(f.stat().st_size for f in files)
        data_bytes = batches * rows * width * 4
    rates = {}
    for r in report.results:
        nbytes = file_bytes if r.name == "numpy.fromfile" else data_bytes
        rates[r.name] = nbytes / r.median / 1e6 if r.ok else math.nan
    report.tables.append(
        Table("Throughput", ["reader", "MB/s"], [[k, f"{v:,.0f}"] for k, v in rates.items()])
    )
    floor = rates["numpy.fromfile"]
    report.checks.append(
        Check(
            "iter_batches sequential / numpy.fromfile (throughput)",
            rates["iter_batches sequential"] / floor,
            0.8,
            ">=",
        )
    )
    report.checks.append(Check("iter_batches shuffled / numpy.fromfile (throughput)", rates["iter_batches shuffled"] / floor, 0.5, ">="))  # fmt: skip
    return report


def _drain(batches: Any) -> int:
    count = 0
    for batch in batches:
        count += len(batch)
    return count


def versus_arrow(cfg: Config) -> Report:
    """Token rows: clouseau.record and iter_batches vs datasets from_generator + shuffle."""
    import datasets

    datasets.disable_progress_bars()
    torch.set_grad_enabled(False)
    model = _gpt2(cfg.tiny)
    n, b, s = (3, 2, 16) if cfg.tiny else (8, 16, 128)
    batches = _tokens(n, b, s)
    report = Report(
        name="dataset-arrow",
        title=f"Token rows vs Hugging Face datasets (GPT-2 4x{model.config.n_embd}, {n} batches of {b}x{s})",
        description="SAELens is not installed here, so the comparison is its documented format: "
        "the same rows (two blocks and the token id, padding dropped) written with "
        "`datasets.Dataset.from_generator` + `save_to_disk`, and read back shuffled with "
        "`Dataset.shuffle(seed)` + `iter(batch_size=4096)`. Writing is timed from the second "
        "batch (both run the same forward passes); the trace of the first is not counted.",
    )
    times: dict[str, list[float]] = {}
    with scratch_dir(cfg, "arrow") as d:
        _record(model, _FromSecond(batches[:1]), d / "trace", True)
        for rep in range(max(2, cfg.reps // 3)):
            times.setdefault("write: clouseau.record", []).append(
                _timed_runs(_record, model, batches, d / "ours", True)
            )
            times.setdefault("write: datasets.from_generator + save_to_disk", []).append(
                _timed_runs(_hf_write, model, batches, d / "hf", True)
            )
            cap = clouseau.load(d / "ours")
            names = [*BLOCKS, "input_ids"]
            started = time.perf_counter()
            _drain(cap.iter_batches(names, 4096, seed=rep))
            times.setdefault("read shuffled: iter_batches", []).append(
                time.perf_counter() - started
            )
            ds = datasets.load_from_disk(str(d / "hf" / "ds")).with_format("numpy")
            started = time.perf_counter()
            _drain(ds.shuffle(seed=rep).iter(batch_size=4096))
            times.setdefault("read shuffled: datasets", []).append(time.perf_counter() - started)
            progress(f"rep {rep + 1}")
    report.results = [Result(name, times=ts) for name, ts in times.items()]
    write = report.ratio("write: clouseau.record", "write: datasets.from_generator + save_to_disk")
    read = report.ratio("read shuffled: iter_batches", "read shuffled: datasets")
    report.checks.append(
        Check("write: record / datasets from_generator + save_to_disk", write, 1.0, "<")
    )
    report.checks.append(
        Check("read shuffled: iter_batches / datasets shuffle + iter", read, 1.0, "<")
    )
    return report


def _hf_write(model: torch.nn.Module, data: _FromSecond, out: Path, rows: bool) -> None:
    import datasets

    saved: dict[str, torch.Tensor] = {}
    hooks = [
        model.get_submodule(name).register_forward_hook(
            lambda m, a, o, name=name: saved.__setitem__(name, o[0] if isinstance(o, tuple) else o)
        )
        for name in BLOCKS
    ]

    def rows_of():
        for batch in data:
            model(**batch)
            keep = batch["attention_mask"].reshape(-1).bool()
            cols = {n: t.reshape(-1, t.shape[-1])[keep].numpy() for n, t in saved.items()}
            ids = batch["input_ids"].reshape(-1)[keep].numpy()
            for i in range(len(ids)):
                yield {**{n: c[i] for n, c in cols.items()}, "input_ids": ids[i]}

    try:
        ds = datasets.Dataset.from_generator(rows_of, cache_dir=str(out / "cache"))
        ds.save_to_disk(str(out / "ds"))
    finally:
        for hook in hooks:
            hook.remove()


def peak_memory(cfg: Config) -> Report:
    """Peak RSS recording 100 and 1,000 batches, each in a fresh interpreter."""
    counts = (10, 100) if cfg.tiny else (100, 1000)
    report = Report(
        name="dataset-memory",
        title="Peak memory against the dataset size",
        description="`clouseau.record` of a Linear(256, 256) over batches of 256 rows "
        "(256 KiB a batch, files of 4 MiB, so both runs write many files). Peak RSS of the process, and its growth "
        "over the interpreter before the recording (the growth left is the capture's own "
        "metadata: a record per batch); each run in a fresh interpreter.",
    )
    runs = {}
    with scratch_dir(cfg, "memory") as d:
        for count in counts:
            progress(f"memory run: {count} batches")
            cmd = [
                sys.executable,
                "-m",
                "bench.bench_dataset",
                json.dumps({"batches": count, "path": str(d / str(count))}),
            ]
            try:
                proc = subprocess.run(
                    cmd, stdout=subprocess.PIPE, text=True, timeout=600, check=True
                )
                runs[count] = json.loads(proc.stdout.strip().splitlines()[-1])
            except Exception as err:  # shown in the table
                runs[count] = {"error": f"{type(err).__name__}: {err}"}
    rows = [
        [f"{c} batches", fmt_mb(r.get("peak_mb", math.nan)), fmt_s(r.get("seconds", math.nan)), r.get("error", "")]
        for c, r in runs.items()
    ]  # fmt: skip
    report.tables.append(
        Table("Peak RSS growth", ["run", "peak RSS growth (MiB)", "time", "note"], rows)
    )
    small, large = (runs[c].get("peak_mb", math.nan) for c in counts)
    report.checks.append(
        Check(f"peak RSS {counts[1]} / {counts[0]} batches", large / small, 1.1, "<=")
    )
    return report


def _memory_child(args: dict[str, Any]) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256))
    g = torch.Generator().manual_seed(0)
    pool = [torch.randn(256, 256, generator=g) for _ in range(8)]
    data = (pool[k % len(pool)] for k in range(args["batches"]))
    torch.set_grad_enabled(False)
    before = _rss_now_mb()
    started = time.perf_counter()
    clouseau.record(model, data, select="0", path=args["path"], progress=False, max_size_mb=4)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_mb": peak - before, "peak_total_mb": peak, "seconds": seconds}))


def _rss_now_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024
    return math.nan


if __name__ == "__main__":
    _memory_child(json.loads(sys.argv[1]))
