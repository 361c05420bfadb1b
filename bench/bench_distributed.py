"""Beyond one process: torchrun ranks against one process, an S3 upload against the disk.

*torchrun* runs ``examples/record_torchrun.py`` (an MLP captured over the same batches)
and ``examples/record_ray.py`` (the same model and batches on 2 Ray actors)
under ``torchrun --nproc-per-node 2`` (one intra-op thread a rank) and under
``torchrun --nproc-per-node 1`` (every core's threads), each timed inside the workers from
before ``instrument`` to after ``close`` (the manifest written), and compares samples per
second. *Upload* captures the same model to ``s3://`` on a moto S3 server on 127.0.0.1 and
to a local directory, in one process, and compares the wall times (close included, so the
upload's tail counts). *Ray overhead* times the Ray example against
``bench/ray_without_capture.py`` (the same Ray Data job, the model run plain) on one
local Ray cluster: clouseau's own share of a Ray job.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch

import clouseau
from bench.harness import Config, progress, scratch_dir
from bench.report import Check, Report, Table, fmt_s

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "record_torchrun.py"
RAY_EXAMPLE = ROOT / "examples" / "record_ray.py"


def _example() -> Any:
    """examples/record_torchrun.py as a module: its model and batches, for the upload run."""
    spec = importlib.util.spec_from_file_location("record_torchrun", EXAMPLE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _sizes(cfg: Config) -> list[str]:
    if cfg.tiny:
        return ["--batches", "4", "--batch-size", "8", "--width", "32"]
    # A deep model of which two layers are captured (1 MB a batch): the compute a sample
    # takes dwarfs what is written, as when a transformer's residual stream is recorded.
    return ["--batches", "1024", "--batch-size", "128", "--width", "1024", "--depth", "8"]


def _torchrun(nproc: int, threads: int, path: Path, cfg: Config) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(EXAMPLE), str(path), "--json", *_sizes(cfg)]  # fmt: skip
    return _timed_command(cmd, env)


def _ray(script: Path, path: Path, cfg: Config) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(script), str(path), "--json", *_sizes(cfg), "--blocks", "16"]
    return _timed_command(cmd, env)


def _timed_command(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """The JSON line the example prints, with the command's wall time."""
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited with {proc.returncode}: {last}")
    return json.loads(lines[-1]) | {"wall_s": wall}


@contextmanager
def _ray_cluster() -> Iterator[None]:
    """A local Ray cluster of 2 CPUs (``ray start --head``) that the Ray example joins."""
    ray = str(Path(sys.executable).with_name("ray"))
    subprocess.run([ray, "start", "--head", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    os.environ["RAY_ADDRESS"] = "auto"
    try:
        yield
    finally:
        del os.environ["RAY_ADDRESS"]
        subprocess.run(
            [ray, "stop", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )


# label, processes, intra-op threads of each (0: a thread per core)
RUNS = (("1 process, 1 thread", 1, 1), ("1 process, a thread per core", 1, 0), ("2 ranks", 2, 1))
RAY = "Ray Data, 2 actors"
RAY_PLAIN = "Ray Data, 2 actors, without clouseau"
RAY_PLAIN_SCRIPT = ROOT / "bench" / "ray_without_capture.py"


def torchrun_scaling(cfg: Config) -> Report:
    """Samples per second: 2 ranks against 1 process over the same batches; Ray against both."""
    report = Report(
        name="dist-torchrun",
        title="torchrun: 2 ranks against 1 process; Ray Data against torchrun",
        description="`examples/record_torchrun.py` (an MLP, two points) over the same "
        "batches under `torchrun --nproc-per-node 2` (one intra-op thread a rank, as "
        "torchrun sets it) and `--nproc-per-node 1` (with one thread, and with a thread "
        "per core), timed inside the workers from before `instrument` to after `close` "
        "(the manifest written). Samples per second count the batches after each rank's "
        "first call (instrument and the first forward: fixed cost per process). Wall time "
        "is the whole command (`torchrun ...`, `python examples/record_ray.py ...`): "
        "processes started, torch imported, the data made, the capture written and "
        "loaded back; the Ray command connects to a local Ray cluster started before it, "
        "as a Ray job does.",
    )
    cores = os.cpu_count() or 1

    def ray(script: Path) -> Callable[[Path], dict[str, float]]:
        def run(path: Path) -> dict[str, float]:
            with _ray_cluster():  # a cluster per run: the torchrun runs have the cores alone
                return _ray(script, path, cfg)

        return run

    runners = {label: partial(_torchrun, nproc, threads or cores, cfg=cfg)
               for label, nproc, threads in RUNS}  # fmt: skip
    runners |= {RAY: ray(RAY_EXAMPLE), RAY_PLAIN: ray(RAY_PLAIN_SCRIPT)}
    with scratch_dir(cfg, "torchrun") as d:
        results, errors = _interleaved(d, runners, 1 if cfg.quick else 3)
    runs = {label: _best(found, errors.get(label)) for label, found in results.items()}
    rows = [[label, f"{r.get('samples_per_s', math.nan):.0f}" + (" (whole run)" if label in (RAY, RAY_PLAIN) else ""),
             fmt_s(r.get("first_s", math.nan)),
             fmt_s(r.get("wall_s", math.nan)), str(r.get("error", ""))]
            for label, r in runs.items()]  # fmt: skip
    head = ["run", "samples/s after the first call", "first call", "wall time", "note"]
    report.tables.append(Table("Best of the runs", head, rows))
    rate = {label: r.get("samples_per_s", math.nan) for label, r in runs.items()}
    report.checks.append(
        Check(
            "torchrun 2 ranks / 1 process, samples/s, one thread a process",
            rate["2 ranks"] / rate["1 process, 1 thread"],
            1.6,
            ">=",
            detail="the data parallelism itself: each process has one intra-op thread",
        )
    )
    report.checks.append(
        Check(
            "torchrun 2 ranks / 1 process, samples/s, a thread per core in the 1 process",
            rate["2 ranks"] / rate["1 process, a thread per core"],
            1.6,
            ">=",
            detail=f"not to be had on {cores} cores: the one process's intra-op threads "
            "already run the matrix products on every core, so 2 ranks gain only the part of "
            "each call that runs on one thread (Python, copying the activations, writing them)",
        )
    )
    wall = {label: r.get("wall_s", math.nan) for label, r in runs.items()}
    report.checks.append(
        Check(
            "Ray Data / torchrun, wall time",
            wall[RAY] / wall["2 ranks"],
            1.3,
            "<=",
            detail="`examples/record_ray.py`: the same batches (in 16 Ray blocks) and model, "
            "2 actors against 2 ranks, each command whole. Ray Data without clouseau (the "
            f"same actors running the plain model) took {wall[RAY_PLAIN] / wall['2 ranks']:.2f}x "
            "torchrun's time: Ray's own costs on this machine (its workers run at nice 15, "
            "below its own processes, and start only once the job has begun)",
        )
    )
    return report  # Ray with / without clouseau, on one cluster: dist-ray-overhead


def ray_overhead(cfg: Config) -> Report:
    """Wall time of the Ray example with clouseau against the same Ray Data job without it."""
    report = Report(
        name="dist-ray-overhead",
        title="Ray Data with clouseau against the same Ray Data job without it",
        description="`examples/record_ray.py` (the torchrun example's MLP over the same "
        "batches, in 16 Ray blocks, on 2 actors, two points recorded) against "
        "`bench/ray_without_capture.py` (the same blocks, actors and model, the model run "
        "plain, nothing saved), each command whole (processes started, torch imported, the "
        "data made, the capture written and loaded back), on one local Ray cluster of 2 CPUs "
        "started once before the runs, as a Ray job joins one. The two alternate, neither "
        "always first, and the least wall time of each is kept.",
    )
    runners = {label: partial(_ray, script, cfg=cfg)
               for label, script in ((RAY, RAY_EXAMPLE), (RAY_PLAIN, RAY_PLAIN_SCRIPT))}  # fmt: skip
    with scratch_dir(cfg, "ray") as d, _ray_cluster():
        runs, errors = _interleaved(d, runners, 2 if cfg.quick else 5)
    if errors:
        raise RuntimeError("; ".join(f"{label}: {err}" for label, err in errors.items()))
    wall = {label: min(r["wall_s"] for r in found) for label, found in runs.items()}
    inner = {label: min(r["seconds"] for r in found) for label, found in runs.items()}
    every = {label: ", ".join(fmt_s(r["wall_s"]) for r in found) for label, found in runs.items()}
    rows = [[label, fmt_s(wall[label]), fmt_s(inner[label]), every[label]] for label in runs]
    head = ["run", "wall time (best)", "the Ray Data job (best)", "every wall time"]
    report.tables.append(Table(f"Best of {len(runs[RAY])} each", head, rows))
    report.checks.append(
        Check(
            "Ray Data with clouseau / the same Ray Data job without it, wall time",
            wall[RAY] / wall[RAY_PLAIN],
            1.15,
            "<=",
            detail="clouseau's own share of a Ray Data job, each command whole; the part "
            f"each script times (the Ray Data job itself) {inner[RAY] / inner[RAY_PLAIN]:.2f}x",
        )
    )
    return report


def _interleaved(
    d: Path, runners: dict[str, Callable[[Path], dict[str, float]]], reps: int
) -> tuple[dict[str, list[dict[str, float]]], dict[str, str]]:
    """Each runner ``reps`` times, interleaved and in reversed order every other repetition
    (a drift in load hits every run, and none is always first), with the first error of
    each (shown, and not run again). Each run's directory is removed after it: a GB each."""
    results: dict[str, list[dict[str, float]]] = {label: [] for label in runners}
    errors: dict[str, str] = {}
    for rep in range(reps):
        for i, label in enumerate(runners if rep % 2 == 0 else reversed(runners)):
            if label in errors:
                continue
            progress(f"{label}, repetition {rep}")
            path = d / f"run-{rep}-{i}"
            try:
                results[label].append(runners[label](path))
            except Exception as err:  # shown in the table
                errors[label] = f"{type(err).__name__}: {err}"
            finally:
                shutil.rmtree(path, ignore_errors=True)
    return results, errors


def _best(results: list[dict[str, float]], error: str | None) -> dict[str, float]:
    """The best of the repetitions: the most samples per second, the least wall time."""
    if error is not None or not results:
        return {"error": error or "no run"}  # type: ignore[dict-item]
    best = {k: min(r[k] for r in results) for k in ("first_s", "wall_s") if k in results[0]}
    return best | {"samples_per_s": max(r["samples_per_s"] for r in results)}


def _capture(path: str, depth: int, cfg: Config) -> float:
    """Seconds from ``instrument`` to ``close`` of the torchrun example's model over batches."""
    example = _example()
    net = example.model(32 if cfg.tiny else 1024, depth)
    batches = [example.batch(i, 128) for i in range(4 if cfg.tiny else 256)]
    started = time.perf_counter()
    fmodel = clouseau.instrument(net, select=["1", "3"], path=path, max_size_mb=8)
    with torch.no_grad(), fmodel:
        for b in batches:
            fmodel(b)
    return time.perf_counter() - started


@contextmanager
def _moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 in a process of its own, as an object store is; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the moto server did not start ({' '.join(cmd)})") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# workload -> hidden layers of the example's model (width 1024, points 1 and 3 saved)
UPLOADS = {"deep (8 layers)": 8, "shallow (2 layers), bound by the upload": 2}


def upload_vs_disk(cfg: Config) -> Report:
    """Wall time of a capture to a local S3 server (moto) against the local disk."""
    report = Report(
        name="dist-upload",
        title="Upload to S3 (moto on 127.0.0.1) against the local disk",
        description="The torchrun example's model (width 1024, points `1` and `3`) over 256 "
        "batches of 128 (256 MB of activations, files of 8 MB) to `s3://` on a moto server "
        "running in a process of its own on 127.0.0.1, and to a local directory, in one "
        "process; wall time from `instrument` to `close` (the upload's tail included). The "
        "upload overlaps the forward passes: with 8 hidden layers the model makes 256 MB "
        "in about 5 s, which moto takes in; with 2 it makes them faster than moto takes "
        "them (about 150 MB/s here), and the capture waits for the upload at close.",
    )
    try:
        import fsspec
        import moto.server  # noqa: F401  (the server runs in a process of its own)
    except ImportError as err:
        report.error = f"needs clouseau[s3] and moto[server]: {err}"
        return report
    times: dict[tuple[str, str], list[float]] = {}
    with _moto_server() as endpoint, scratch_dir(cfg, "upload") as d:
        conf = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
        fsspec.config.conf["s3"] = conf
        s3 = fsspec.filesystem("s3", **conf)
        s3.mkdir("bench")
        for rep in range(2 if cfg.quick else 5):
            for workload, depth in UPLOADS.items():
                progress(f"upload, {workload}, repetition {rep}")
                order = ("disk", "s3") if rep % 2 == 0 else ("s3", "disk")  # neither always first
                for where in order:
                    path = str(d / f"disk-{rep}") if where == "disk" else f"s3://bench/run-{rep}"
                    times.setdefault((workload, where), []).append(_capture(path, depth, cfg))
                shutil.rmtree(d / f"disk-{rep}", ignore_errors=True)
                s3.rm(f"bench/run-{rep}", recursive=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    rows = [[w, fmt_s(med[w, "disk"]), fmt_s(med[w, "s3"]), f"{med[w, 's3'] / med[w, 'disk']:.2f}x"]
            for w in UPLOADS]  # fmt: skip
    head = ["model", "local disk", "s3 (moto)", "s3 / disk"]
    report.tables.append(Table("Median wall time", head, rows))
    deep = next(iter(UPLOADS))
    report.checks.append(
        Check(
            "upload / local disk, wall time",
            med[deep, "s3"] / med[deep, "disk"],
            1.3,
            "<=",
            detail=f"the {deep} model",
        )
    )
    return report
