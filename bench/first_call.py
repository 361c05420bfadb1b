"""What the first call of an instrumented model costs, per tier, and where the time goes.

    python -m bench.first_call          # ResNet-18 and GPT-2 (6x256), every tier
    python -m bench.first_call --quick  # smaller inputs

Each (model, tier) runs in a fresh interpreter, so the first call pays what a user's first
call pays (clouseau's lazy imports of torch.fx / torch.export included). The tiers:

- *hooks*: a selection of module outputs only (forward hooks, no trace);
- *traced*: ``select="*"``, traced by torch.fx, or torch.export where fx fails (GPT-2);
- *dynamo*: ``torch.compile(model, backend=clouseau.backend(select="*"))``, the route of
  models Dynamo must split (the dynamic tier compiles the same way).

A second fresh ``instrument`` of the same model and selection is timed too (its first
call), and the second call of each, in wall and CPU time (the steadier witness on a shared
machine). The breakdown comes from ``cProfile`` in a second fresh interpreter (the timed
one runs without it): the cumulative seconds in torch.fx's tracer, the symbolic-shape run
that labels the IR's sizes (``f32[s0,...]``), torch.export, the probe (the first call
itself, run through an fx interpreter to learn shapes, in-place mutation and aliasing), and
Dynamo.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import pstats
import subprocess
import sys
import time
from typing import Any

import torch

PARTS = {
    "fx trace": ("tracing/fx.py", "trace_fx"),
    "symbolic shapes": ("tracing/symbolic.py", "fx_symbols"),
    "torch.export": ("tracing/export.py", "trace_export"),
    "probe (first run)": ("tracing/probe.py", "probe_call"),
    "dynamo compile": ("convert_frame.py", "_compile"),
}


def _model(name: str, quick: bool) -> tuple[torch.nn.Module, tuple[Any, ...], list[str]]:
    importlib.import_module("tests.conftest")  # torchvision's schemas beside CPU torch
    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18().eval()
        x = torch.randn(1 if quick else 8, 3, 224, 224)
        return model, (x,), ["layer1.1", "layer2.1", "layer3.1", "layer4.1"]
    from bench.peers_tools import gpt2

    model = gpt2(6, 256)
    ids = torch.randint(2, 1000, (2 if quick else 8, 128))
    return model, (ids,), ["transformer.h.*.mlp"]


def _one(name: str, tier: str, quick: bool, profiled: bool) -> dict[str, Any]:
    torch.set_grad_enabled(False)
    model, inputs, modules = _model(name, quick)
    t0, c0 = time.perf_counter(), time.process_time()
    model(*inputs)
    forward, forward_cpu = time.perf_counter() - t0, time.process_time() - c0
    import clouseau

    def build() -> Any:
        if tier == "dynamo":
            return torch.compile(model, backend=clouseau.backend(select="*", path=None))
        return clouseau.instrument(model, select=modules if tier == "hooks" else "*", path=None)

    profile = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    if profiled:
        profile.enable()
    fmodel = build()
    fmodel(*inputs)
    profile.disable()
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    fmodel(*inputs)
    second_call = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = build()
    again(*inputs)
    second_instrument = time.perf_counter() - t0
    parts = {}
    if profiled:
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        for label, (file, func) in PARTS.items():
            parts[label] = sum(
                v[3] for (f, _, fn), v in stats.items() if f.endswith(file) and fn == func
            )
    return {
        "forward": forward,
        "forward_cpu": forward_cpu,
        "first": first,
        "first_cpu": first_cpu,
        "second_call": second_call,
        "second_instrument": second_instrument,
        **parts,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.first_call", description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--models", nargs="*", default=["resnet18", "gpt2"])
    p.add_argument("--tiers", nargs="*", default=["hooks", "traced", "dynamo"])
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        name, tier, profiled = args.worker
        print(json.dumps(_one(name, tier, args.quick, profiled == "profiled")))
        return
    print("| model | tier | forward (CPU) | first call (CPU) | of it: fx / symbolic / export / "
          "probe / dynamo | second call | new instrument + first call |")  # fmt: skip
    print("|---|---|---:|---:|---|---:|---:|")
    for name in args.models:
        for tier in args.tiers:
            try:
                # Timed without the profiler (which slows Python-heavy code), then profiled
                # in another fresh interpreter for the breakdown.
                r = _worker(name, tier, args.quick, "timed")
                r.update({k: v for k, v in _worker(name, tier, args.quick, "profiled").items()
                          if k in PARTS})  # fmt: skip
            except RuntimeError as err:
                print(f"| {name} | {tier} | failed: {err} |")
                continue
            parts = " / ".join(f"{r[k]:.2f}" for k in PARTS)
            print(
                f"| {name} | {tier} | {r['forward'] * 1e3:.0f} ms ({r['forward_cpu'] * 1e3:.0f} ms) "
                f"| {r['first']:.2f} s ({r['first_cpu']:.2f} s) | {parts} s "
                f"| {r['second_call'] * 1e3:.0f} ms | {r['second_instrument'] * 1e3:.0f} ms |",
                flush=True,
            )


def _worker(name: str, tier: str, quick: bool, mode: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.first_call", "--worker", name, tier, mode]
    cmd += ["--quick"] if quick else []
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
