"""Beyond one process: torchrun ranks against one process, an S3 upload against the disk.

*torchrun* runs ``examples/record_torchrun.py`` (an MLP captured over the same batches)
and ``examples/record_ray.py`` (the same model and batches on 2 Ray actors)
under ``torchrun --nproc-per-node 2`` (one intra-op thread a rank) and under
``torchrun --nproc-per-node 1`` (every core's threads), each timed inside the workers from
before ``instrument`` to after ``close`` (the manifest written), and compares samples per
second. *Upload* captures the same model to ``s3://`` on a moto S3 server on 127.0.0.1 and
to a local directory, in one process, and compares the wall times (close included, so the
upload's tail counts).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import clouseau
from bench.harness import Config, progress, scratch_dir
from bench.report import Check, Report, Table, fmt_s

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "record_torchrun.py"
RAY_EXAMPLE = ROOT / "examples" / "record_ray.py"


def _sizes(cfg: Config) -> list[str]:
    if cfg.tiny:
        return ["--batches", "4", "--batch-size", "8", "--width", "32"]
    return ["--batches", "256", "--batch-size", "128", "--width", "512"]


def _torchrun(nproc: int, threads: int, path: Path, cfg: Config) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(EXAMPLE), str(path), "--json", *_sizes(cfg)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"torchrun exited with {proc.returncode}")
    return json.loads(lines[-1])


def torchrun_scaling(cfg: Config) -> Report:
    """Samples per second: 2 ranks against 1 process over the same batches."""
    report = Report(
        name="dist-torchrun",
        title="torchrun: 2 ranks against 1 process",
        description="`examples/record_torchrun.py` (an MLP, two points) over the same "
        "batches under `torchrun --nproc-per-node 2` (one intra-op thread a rank) and "
        "`--nproc-per-node 1` (a thread per core), timed inside the workers from before "
        "`instrument` to after `close` (the manifest written). Samples per second count "
        "the batches after each rank's first call (which traces the model, seconds of "
        "fixed cost per process); Ray Data's wall time is compared with the whole 2-rank "
        "run, tracing included on both sides.",
    )
    runs: dict[str, dict[str, float]] = {}
    cores = os.cpu_count() or 1
    with scratch_dir(cfg, "torchrun") as d:
        for label, nproc, threads in (("1 process", 1, cores), ("2 ranks", 2, 1)):
            progress(f"torchrun {label}")
            best: dict[str, float] = {}
            for rep in range(1 if cfg.quick else 3):
                try:
                    run = _torchrun(nproc, threads, d / f"{nproc}-{rep}", cfg)
                except Exception as err:  # shown in the table
                    best = {"error": f"{type(err).__name__}: {err}"}  # type: ignore[dict-item]
                    break
                if run["samples_per_s"] > best.get("samples_per_s", 0):
                    best = run
            runs[label] = best
    rows = [[label, f"{r.get('samples_per_s', math.nan):.0f}", fmt_s(r.get("first_s", math.nan)),
             fmt_s(r.get("seconds", math.nan)), str(r.get("error", ""))]
            for label, r in runs.items()]  # fmt: skip
    head = ["run", "samples/s after the first call", "first call", "whole run", "note"]
    report.tables.append(Table("Best of the runs", head, rows))
    one, two = (runs[k].get("samples_per_s", math.nan) for k in ("1 process", "2 ranks"))
    report.checks.append(
        Check(
            "torchrun 2 ranks / 1 process, samples/s",
            two / one,
            1.6,
            ">=",
            detail=f"{cores} cores shared with other work: two ranks can at best use the "
            "cores one process's threads already use, so no speed-up is expected here",
        )
    )
    ray_run = _ray(cfg)
    rows.append(["Ray Data, 2 actors", f"{ray_run.get('samples_per_s', math.nan):.0f} (whole run)",
                 "", fmt_s(ray_run.get("seconds", math.nan)), str(ray_run.get("error", ""))])  # fmt: skip
    report.checks.append(
        Check(
            "Ray Data / torchrun, wall time",
            ray_run.get("seconds", math.nan)
            / runs["2 ranks"].get("seconds", math.nan),  # whole runs
            1.3,
            "<=",
            detail="`examples/record_ray.py`, same batches (in 8 Ray blocks) and model, 2 "
            "actors against 2 ranks; timed around `clouseau.ray.record` (actors started and models built "
            "inside, the local cluster started before)",
        )
    )
    return report


def _ray(cfg: Config) -> dict[str, float]:
    """The Ray example over the batches of the torchrun runs (best of the repetitions)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    best: dict[str, float] = {}
    with scratch_dir(cfg, "ray") as d:
        for rep in range(1 if cfg.quick else 3):
            progress(f"ray rep {rep}")
            cmd = [sys.executable, str(RAY_EXAMPLE), str(d / f"ray-{rep}"), "--json", *_sizes(cfg),
                   "--blocks", "8"]  # fmt: skip
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=600)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not lines:
                return {"error": f"record_ray.py exited with {proc.returncode}"}  # type: ignore[dict-item]
            run = json.loads(lines[-1])
            if run["samples_per_s"] > best.get("samples_per_s", 0):
                best = run
    return best


def _capture(path: str, cfg: Config) -> float:
    width = 32 if cfg.tiny else 512
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.GELU(), torch.nn.Linear(width, 64)
    )
    batches = [torch.randn(128, 64) for _ in range(4 if cfg.tiny else 64)]
    started = time.perf_counter()
    fmodel = clouseau.instrument(net, select=["0", "1"], path=path, max_size_mb=8)
    with torch.no_grad(), fmodel:
        for b in batches:
            fmodel(b)
    return time.perf_counter() - started


def upload_vs_disk(cfg: Config) -> Report:
    """Wall time of a capture to a local S3 server (moto) against the local disk."""
    report = Report(
        name="dist-upload",
        title="Upload to S3 (moto on 127.0.0.1) against the local disk",
        description="The same capture to `s3://` on a moto server on 127.0.0.1 and to a "
        "local directory, in one process; wall time from `instrument` to `close` (the "
        "upload's tail included).",
    )
    try:
        import fsspec
        from moto.server import ThreadedMotoServer
    except ImportError as err:
        report.error = f"needs clouseau[s3] and moto[server]: {err}"
        return report
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server._server.server_port}"
        conf = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
        fsspec.config.conf["s3"] = conf
        fsspec.filesystem("s3", **conf).mkdir("bench")
        times: dict[str, list[float]] = {"disk": [], "s3": []}
        with scratch_dir(cfg, "upload") as d:
            for rep in range(2 if cfg.quick else 5):
                progress(f"upload rep {rep}")
                times["disk"].append(_capture(str(d / f"disk-{rep}"), cfg))
                times["s3"].append(_capture(f"s3://bench/run-{rep}", cfg))
    finally:
        server.stop()
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    report.tables.append(
        Table("Median wall time", ["destination", "time"], [[k, fmt_s(v)] for k, v in med.items()])
    )
    report.checks.append(
        Check("upload / local disk, wall time", med["s3"] / med["disk"], 1.3, "<=")
    )
    return report
