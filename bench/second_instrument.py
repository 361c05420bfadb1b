"""A second ``with clouseau.instrument(...)`` of the same model and selection, against a forward.

    python -m bench.second_instrument

The quickstart model (examples/quickstart_torch.py, ``select="relu*"``, 4x3x32x32) is
instrumented once (traced on its first call), then a fresh instrumented model of the same
model and selection is built, called once and closed, ``--reps`` times; the median of that
against the median of one plain forward is the ratio the issue's target bounds (< 1). CPU
time (every thread of the process) is printed beside wall time: on a busy machine it is
the steadier witness.
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
        wall: dict[str, list[float]] = {"forward": [], "path=DIR": [], "path=None": []}
        cpu: dict[str, list[float]] = {k: [] for k in wall}
        for k in range(args.reps):
            for label, where in (
                ("forward", None),
                ("path=DIR", Path(tmp) / str(k)),
                ("path=None", None),
            ):
                c0, t0 = time.process_time(), time.perf_counter()
                if label == "forward":
                    model(x)
                else:
                    _once(model, x, where)
                wall[label].append(time.perf_counter() - t0)
                cpu[label].append(time.process_time() - c0)
    f, fc = statistics.median(wall["forward"]), statistics.median(cpu["forward"])
    print(f"plain forward: {f * 1e3:.2f} ms (CPU {fc * 1e3:.2f} ms)")
    for label in ("path=DIR", "path=None"):
        a, ac = statistics.median(wall[label]), statistics.median(cpu[label])
        print(f"a second instrument + first call + close, {label}: {a * 1e3:.2f} ms "
              f"({a / f:.2f}x the forward); CPU {ac * 1e3:.2f} ms ({ac / fc:.2f}x)")  # fmt: skip


def _once(model: torch.nn.Module, x: torch.Tensor, path: Path | None) -> None:
    with clouseau.instrument(model, select="relu*", path=path) as fmodel:
        fmodel(x)


if __name__ == "__main__":
    main()
