"""Timing machinery: interleaved variants, warm-ups, medians, peak RSS, machine facts.

A *comparison* is a list of :class:`Variant` s timed in one process. Every repetition runs
each variant once, in an order rotated by one per repetition, so slow drift of the machine
(thermal, page cache, other tenants) lands on every variant alike rather than on whichever
ran last. A sample times ``inner`` back-to-back steps (chosen so a sample lasts at least
``min_sample_s``) because a single forward of the MLP takes a few milliseconds, close to
timer and scheduler noise. Each comparison runs in its own subprocess (see ``__main__``) so
that allocator state, thread pools and caches of one model never colour another.
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Step = Callable[[], Any]


@dataclass
class Config:
    """How hard a comparison works: repetitions, warm-ups, sizes, where files go."""

    quick: bool = False
    tiny: bool = False  # shrink the models (the smoke test); the numbers mean nothing then
    reps: int = 9
    warmup: int = 2
    min_sample_s: float = 0.05
    threads: int = 0  # intra-op threads of torch and XLA; 0: every usable core
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))

    @classmethod
    def make(
        cls, quick: bool, tiny: bool, workdir: Path | None = None, threads: int | None = None
    ) -> Config:
        """The defaults for a full run, ``--quick`` or the smoke test's tiny sizes."""
        if tiny:
            # One thread: tiny ops on a thread pool cost more in hand-offs than in work,
            # and the smoke test must stay fast on a busy machine.
            cfg = cls(quick=True, tiny=True, reps=2, warmup=1, min_sample_s=0.0, threads=1)
        elif quick:
            cfg = cls(quick=True, reps=3, warmup=1, min_sample_s=0.02)
        else:
            cfg = cls()
        if workdir is not None:
            cfg.workdir = workdir
        if threads is not None:
            cfg.threads = threads
        return cfg

    def thread_env(self) -> dict[str, str]:
        """Environment variables that cap the frameworks' thread pools (none when 0).

        They must be set before torch or jax is imported, hence in the worker's
        environment rather than by a call inside it.
        """
        if self.threads <= 0:
            return {}
        n = str(self.threads)
        env = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}
        if self.threads == 1:
            env["XLA_FLAGS"] = (
                os.environ.get("XLA_FLAGS", "")
                + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
            ).strip()
        return env

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["workdir"] = str(self.workdir)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Config:
        return cls(**{**d, "workdir": Path(d["workdir"])})


@dataclass
class Variant:
    """One way of running a model, timed as ``step``.

    ``after`` runs untimed after every sample (deleting written files, clearing an
    in-memory capture, so the next sample starts from the same state); ``close`` runs once
    at the end. A variant that could not be built carries ``skip`` (the reason) instead.
    """

    name: str
    step: Step | None = None
    after: Callable[[], None] | None = None
    close: Callable[[], None] | None = None
    skip: str | None = None
    note: str = ""


@dataclass
class Result:
    """The samples of one variant: seconds per step, and the peak RSS growth of one step."""

    name: str
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # process CPU seconds per step, all threads
    peak_mb: list[float] = field(default_factory=list)
    inner: int = 1
    skip: str | None = None
    error: str | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.skip is None and self.error is None and bool(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.nan

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu) if self.cpu else math.nan

    @property
    def peak(self) -> float:
        return max(self.peak_mb) if self.peak_mb else math.nan

    def spread(self) -> float:
        """The interquartile range relative to the median: how far one sample is trusted."""
        if len(self.times) < 4:
            return (max(self.times) - min(self.times)) / self.median if self.times else math.nan
        q = statistics.quantiles(self.times, n=4)
        return (q[2] - q[0]) / self.median


def skipped(name: str, err: BaseException | str, note: str = "") -> Variant:
    """A variant that cannot run here, with the reason shown in the table."""
    reason = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    return Variant(name, skip=_one_line(reason), note=note)


def build(name: str, factory: Callable[[], Variant], note: str = "") -> Variant:
    """``factory()``, or a skipped variant naming the error when building it fails.

    Clouseau variants are built this way so that a frontend that is missing or broken
    shows up as one line in the table instead of losing the whole comparison.
    """
    try:
        v = factory()
    except Exception as err:
        return skipped(name, err, note)
    v.name = name
    v.note = v.note or note
    return v


def progress(message: str) -> None:
    """A line on stderr, which the parent passes through: long comparisons show life."""
    print(f"    {message}", file=sys.stderr, flush=True)


def run_variants(variants: list[Variant], cfg: Config, reps: int | None = None) -> list[Result]:
    """Warm up every variant, time them interleaved, then measure each one's peak memory.

    ``reps`` overrides ``cfg.reps`` (for variants too slow to repeat as often).
    """
    results = {v.name: Result(v.name, skip=v.skip, note=v.note) for v in variants}
    live = [v for v in variants if v.skip is None]
    # Warm-up: first calls (tracing, compiling, allocator growth) are not what we measure.
    # The step time seen here also sizes each variant's inner loop.
    for v in live:
        started = time.perf_counter()
        try:
            t = math.inf
            for _ in range(max(1, cfg.warmup)):
                # The fastest warm-up step sizes the samples: on a shared machine one step
                # descheduled for a time slice would make them single, cold calls.
                t = min(t, _timed(v.step, 1))  # type: ignore[arg-type]
                _after(v)
            results[v.name].inner = _inner_count(t, cfg.min_sample_s)
        except Exception as err:
            results[v.name].error = _error(err)
        progress(f"warm-up {v.name}: {time.perf_counter() - started:.2f} s")
    for rep in range(reps if reps is not None else cfg.reps):
        order = [v for v in live if results[v.name].error is None]
        if not order:
            break
        k = rep % len(order)
        for v in order[k:] + order[:k]:
            r = results[v.name]
            try:
                wall, cpu = _timed_both(v.step, r.inner)  # type: ignore[arg-type]
                r.times.append(wall / r.inner)
                r.cpu.append(cpu / r.inner)
                _after(v)
            except Exception as err:
                r.error = _error(err)
    # Memory is measured in a pass of its own, after the timing: it must start from memory
    # handed back to the kernel (malloc_trim), which the timed steps should not pay for.
    for v in live:
        r = results[v.name]
        if r.error is None:
            try:
                r.peak_mb.append(step_peak_mb(v.step))  # type: ignore[arg-type]
                _after(v)
            except Exception as err:
                r.error = _error(err)
    for v in live:
        if v.close is not None:
            try:
                v.close()
            except Exception as err:
                results[v.name].error = results[v.name].error or _error(err)
    return [results[v.name] for v in variants]


def _timed(step: Step, inner: int) -> float:
    return _timed_both(step, inner)[0]


def _timed_both(step: Step, inner: int) -> tuple[float, float]:
    """Wall seconds and process CPU seconds (every thread) of ``inner`` steps.

    CPU time is shown beside the wall time because it barely moves when other processes
    compete for the cores, which makes it the better witness of an overhead on a busy
    machine (the targets still use wall time).
    """
    gc.collect()
    # As timeit does: a collection in the middle of one sample is noise, not the cost of
    # the variant (the collect above already paid for the garbage of the last sample).
    gc.disable()
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(inner):
            step()
        return time.perf_counter() - t0, time.process_time() - c0
    finally:
        gc.enable()


def _after(v: Variant) -> None:
    if v.after is not None:
        v.after()


def _inner_count(step_s: float, min_sample_s: float) -> int:
    if min_sample_s <= 0 or step_s <= 0:
        return 1
    return max(1, min(200, math.ceil(min_sample_s / step_s)))


def time_once(step: Step) -> float:
    """Seconds of one call of ``step`` (first-call costs, which are never repeated)."""
    gc.collect()
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


# -- memory ---------------------------------------------------------------------------------
def _status_kb(field_name: str) -> float:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return math.nan
    m = re.search(rf"^{field_name}:\s+(\d+) kB", text, re.M)
    return float(m.group(1)) if m else math.nan


def rss_mb() -> float:
    """The resident set size of this process now, in MiB (Linux; NaN elsewhere)."""
    return _status_kb("VmRSS") / 1024


def peak_rss_mb() -> float:
    """The peak resident set size since the last :func:`reset_peak`, in MiB."""
    hwm = _status_kb("VmHWM")
    if math.isnan(hwm):  # no /proc: ru_maxrss is the peak since the process started
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return hwm / 1024


def step_peak_mb(step: Step) -> float:
    """The growth of the resident set during one call of ``step``, in MiB.

    Freed memory that the allocator kept would be reused without growing the RSS and hide
    the step's own allocations, so it is handed back first (glibc's ``malloc_trim``).
    """
    gc.collect()
    trim_heap()
    reset_peak()
    base = rss_mb()
    step()
    return max(0.0, peak_rss_mb() - base)


def trim_heap() -> None:
    """Return the C heap's free memory to the kernel (glibc only; a no-op elsewhere)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


def reset_peak() -> None:
    """Reset the kernel's peak-RSS mark, so the next peak belongs to the next step alone.

    Writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS (Linux >= 4.0);
    without it the peak of one variant would mask every later one in the same process.
    """
    with suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


# -- files ------------------------------------------------------------------------------------
@contextmanager
def scratch_dir(cfg: Config, prefix: str) -> Iterator[Path]:
    """A fresh directory under the work dir, removed afterwards."""
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"clouseau-bench-{prefix}-", dir=cfg.workdir))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def remove_files(directory: Path, pattern: str = "*.safetensors") -> None:
    """Delete what a sample wrote, so the disk never fills over a run (untimed)."""
    for f in directory.glob(pattern):
        f.unlink(missing_ok=True)


def dir_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


# -- the machine ------------------------------------------------------------------------------
def machine() -> dict[str, str]:
    """CPU model, cores, RAM, OS and Python, for the header of RESULTS.md."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = _meminfo_gib()
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "usable cores": str(
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
        ),
        "ram": f"{ram:.1f} GiB" if not math.isnan(ram) else "?",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def _meminfo_gib() -> float:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return math.nan
    m = re.search(r"^MemTotal:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 2**20 if m else math.nan


def versions() -> dict[str, str]:
    """Versions of clouseau and of every framework the benchmarks touch."""
    from importlib import metadata

    out = {}
    for dist in (
        "clouseau",
        "torch",
        "jax",
        "jaxlib",
        "equinox",
        "numpy",
        "safetensors",
        "torchlens",
        "nnsight",
        "transformer-lens",
        "transformers",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


# -- serialising what a worker measured -----------------------------------------------------
def result_to_json(r: Result) -> dict[str, Any]:
    return asdict(r)


def result_from_json(d: dict[str, Any]) -> Result:
    return Result(**d)


def dump(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1, default=_json_default))


def _json_default(o: object) -> object:
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def _error(err: BaseException) -> str:
    tb = traceback.extract_tb(err.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return _one_line(f"{type(err).__name__}: {err}{where}")


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the arrays a capture holds (what the floors write) ----------------------------------------
def captured_arrays(
    model: Any,
    inputs: tuple[Any, ...],
    select: str,
    path: Path,
    convert: Callable[[Any], Any],
    finish: Callable[[Any], Any] = lambda out: out,
) -> dict[str, Any] | str:
    """The arrays clouseau saves for ``select``, converted, by file key; or why not.

    The floors write exactly these (same keys, shapes, dtypes, bytes); if clouseau cannot
    capture, the floor is skipped with the reason.
    """
    try:
        import clouseau

        with clouseau.instrument(model, select=select, path=path) as fmodel:
            finish(fmodel(*inputs))
    except Exception as err:
        return f"needs clouseau's capture of select={select!r}: {type(err).__name__}: {err}"
    return loaded_arrays(path, convert)


def loaded_arrays(path: Path, convert: Callable[[Any], Any]) -> dict[str, Any] | str:
    """The arrays of the capture at ``path``, converted, by file key; or why not."""
    try:
        import clouseau

        cap = clouseau.load(path)
        if not cap.records:
            return f"the capture in {path} is empty (its first call failed)"
        return {r.key: convert(cap.get(r.name, call=r.call)) for r in cap.records}
    except Exception as err:
        return f"needs a clouseau capture for its arrays: {type(err).__name__}: {err}"
