"""A second ``with clouseau.instrument(...)`` of the same model and selection, against a forward.

    python -m bench.second_instrument

The quickstart model (examples/quickstart_torch.py, ``select="relu*"``, 4x3x32x32) is
instrumented once (traced on its first call), then a fresh instrumented model of the same
model and selection is built, called once and closed, ``--reps`` times; the median of that
against the median of one plain forward is the ratio the issue's target bounds (< 1).
Both to disk, as the quickstart does (``path=``), and in memory (``path=None``): the
difference is the capture directory's own files (lock, status, the graph's JSON).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch

import clouseau


def _quickstart() -> torch.nn.Module:
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location(
        "quickstart", root / "examples" / "quickstart_torch.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.ResNet().eval()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.second_instrument", description=__doc__)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()
    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    model, x = _quickstart(), torch.randn(4, 3, 32, 32)
    with tempfile.TemporaryDirectory() as tmp:
        with clouseau.instrument(model, select="relu*", path=Path(tmp) / "first") as fmodel:
            fmodel(x)  # the first instrument traces
        forward, disk, memory = [], [], []
        for k in range(args.reps):
            t0 = time.perf_counter()
            model(x)
            t1 = time.perf_counter()
            with clouseau.instrument(model, select="relu*", path=Path(tmp) / str(k)) as fmodel:
                fmodel(x)
            t2 = time.perf_counter()
            with clouseau.instrument(model, select="relu*", path=None) as fmodel:
                fmodel(x)
            t3 = time.perf_counter()
            forward.append(t1 - t0)
            disk.append(t2 - t1)
            memory.append(t3 - t2)
    f = statistics.median(forward)
    print(f"plain forward: {f * 1e3:.2f} ms")
    for label, times in (("path=DIR", disk), ("path=None", memory)):
        a = statistics.median(times)
        print(f"a second instrument + first call + close, {label}: {a * 1e3:.2f} ms "
              f"({a / f:.2f}x the forward)")  # fmt: skip


if __name__ == "__main__":
    main()
