"""The write size that puts a file on disk fastest on this machine (store/safetensors_io.py).

    python -m bench.write_chunk            # 12 MiB files, both page-cache states
    python -m bench.write_chunk --mib 48   # bigger files

Writes the same arrays (12 of them, a 12 MiB activation file by default) with clouseau's own
``write_file``, its bound on one write call (``WRITE_CHUNK``) set from 64 KiB to the whole
file (one ``writev``, the writer before the bound), interleaved, in two
page-cache states: files removed after every sample (the kernel frees their pages), and
files kept, so that dirty pages pile up and write-back runs under the writes. Prints the
median milliseconds per file and the ratio to the best chunk.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from clouseau.store import safetensors_io

KIB = 1024
_DEFAULT = safetensors_io.WRITE_CHUNK
CHUNKS = (64 * KIB, 256 * KIB, 512 * KIB, 1024 * KIB, 2048 * KIB, 4096 * KIB, 0)  # 0: whole


def write_chunked(path: Path, arrays: list[tuple[str, np.ndarray]], chunk: int) -> None:
    """``arrays`` to ``path`` by clouseau's writer, at most ``chunk`` bytes a call (0: one)."""
    safetensors_io.WRITE_CHUNK = chunk or 2**40
    try:
        safetensors_io.write_file(path, arrays, {})
    finally:
        safetensors_io.WRITE_CHUNK = _DEFAULT


def measure(mib: int, reps: int, keep: bool, directory: Path) -> dict[int, float]:
    """Median seconds per file for every chunk, interleaved over ``reps`` repetitions."""
    rng = np.random.default_rng(0)
    # 12 arrays as a capture of 12 module outputs holds them, 1 MiB each by default.
    size = mib * KIB * KIB // 4 // 12
    arrays = [(f"a{i}", rng.standard_normal(size, dtype=np.float32)) for i in range(12)]
    times: dict[int, list[float]] = {c: [] for c in CHUNKS}
    n = 0
    for rep in range(reps):
        order = CHUNKS[rep % len(CHUNKS) :] + CHUNKS[: rep % len(CHUNKS)]
        for chunk in order:
            path = directory / f"f{n}.safetensors"
            n += 1
            t0 = time.perf_counter()
            write_chunked(path, arrays, chunk)
            times[chunk].append(time.perf_counter() - t0)
            if not keep:
                path.unlink()
    for f in directory.glob("f*.safetensors"):
        f.unlink()
    return {c: statistics.median(t) for c, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.write_chunk", description=__doc__)
    p.add_argument("--mib", type=int, default=12, help="the size of one file in MiB")
    p.add_argument("--reps", type=int, default=15, help="interleaved repetitions")
    p.add_argument("--dir", help="where the files go (default: the temp dir)")
    args = p.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="clouseau-chunk-", dir=base) as tmp:
        for keep in (False, True):
            medians = measure(args.mib, args.reps, keep, Path(tmp))
            best = min(medians.values())
            state = "files kept (dirty pages pile up)" if keep else "files removed"
            print(f"{args.mib} MiB per file, {state}:")
            for chunk, t in medians.items():
                label = "whole file" if chunk == 0 else f"{chunk // KIB} KiB"
                print(f"  {label:>10}: {t * 1e3:8.2f} ms  {t / best:5.2f}x the best")


if __name__ == "__main__":
    main()
