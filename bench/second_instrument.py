"""A second ``with clouseau.instrument(...)`` of the same model and selection, against a forward.

    python -m bench.second_instrument

The quickstart model (examples/quickstart_torch.py, ``select="relu*"``, 4x3x32x32) is
instrumented once (traced on its first call), then a fresh instrumented model of the same
model and selection is built, called once and closed, ``--reps`` times. Its own share (the
median of that, less the median of its baseline) against the median of one plain forward
is the ratio the issue's target bounds (< 1). In memory (``path=None``) the baseline is the
plain forward; to disk (``path=``, as the quickstart does) it is the floor: the forward
with forward hooks that clone the same outputs and ``safetensors.torch.save_file`` of them
to a new file of the same directory, its values checked equal to clouseau's before timing.
Every sample's files are removed before the next, so both write into the same page-cache
state (kept files pile up dirty pages, and once the kernel throttles, a 1.8 MB write costs
4.5 ms instead of 0.7 ms on this machine). CPU time (every thread of the process) is
printed beside wall time: on a busy machine it is the steadier witness.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import tempfile
import time
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

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
            captured = [fmodel.captured[n] for n in fmodel.captured.names()]
        relus = tuple(
            m for n, m in model.named_modules() if n and fnmatch(n.rsplit(".", 1)[-1], "relu*")
        )
        _floor(model, relus, x, Path(tmp) / "check")  # the floor saves what clouseau saved
        floor = load_file(str(Path(tmp) / "check" / "activations.safetensors"))
        assert len(floor) == len(captured), (len(floor), len(captured))
        for k, value in enumerate(captured):
            assert np.array_equal(floor[str(k)].numpy(), value), f"value {k} differs"
        labels = ("forward", "floor", "path=DIR", "path=None")
        wall: dict[str, list[float]] = {k: [] for k in labels}
        cpu: dict[str, list[float]] = {k: [] for k in labels}
        for k in range(args.reps):
            for label in labels:
                where = Path(tmp) / f"{label}{k}"
                c0, t0 = time.process_time(), time.perf_counter()
                if label == "forward":
                    model(x)
                elif label == "floor":
                    _floor(model, relus, x, where)
                else:
                    _once(model, x, where if label == "path=DIR" else None)
                wall[label].append(time.perf_counter() - t0)
                cpu[label].append(time.process_time() - c0)
                shutil.rmtree(where, ignore_errors=True)
    print(f"{len(captured)} points saved per call, equal to the floor's")
    med = {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in labels}
    (f, fc), (floor, floorc) = med["forward"], med["floor"]
    print(f"plain forward: {f * 1e3:.2f} ms (CPU {fc * 1e3:.2f} ms)")
    print(f"floor (forward + hooks + save_file): {floor * 1e3:.2f} ms (CPU {floorc * 1e3:.2f} ms)")
    for label, (base, basec) in (("path=DIR", (floor, floorc)), ("path=None", (f, fc))):
        a, ac = med[label]
        print(f"a second instrument + first call + close, {label}: {a * 1e3:.2f} ms; its own "
              f"share {(a - base) * 1e3:.2f} ms ({(a - base) / f:.2f}x the forward), CPU "
              f"{(ac - basec) * 1e3:.2f} ms ({(ac - basec) / fc:.2f}x)")  # fmt: skip


def _floor(
    model: torch.nn.Module, modules: tuple[torch.nn.Module, ...], x: torch.Tensor, where: Path
) -> None:
    """A forward with hooks that clone the selected outputs, saved with ``save_file``."""
    saved: dict[str, torch.Tensor] = {}

    def keep(module: torch.nn.Module, args: object, out: torch.Tensor) -> None:
        saved[str(len(saved))] = out.clone()

    handles = [m.register_forward_hook(keep) for m in modules]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    where.mkdir()
    save_file(saved, str(where / "activations.safetensors"))


def _once(model: torch.nn.Module, x: torch.Tensor, path: Path | None) -> None:
    with clouseau.instrument(model, select="relu*", path=path) as fmodel:
        fmodel(x)


if __name__ == "__main__":
    main()
