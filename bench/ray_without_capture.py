"""``examples/record_ray.py``'s run without clouseau: what Ray Data costs by itself.

    python bench/ray_without_capture.py --batches 1024 --batch-size 128 --width 1024 --depth 8

The same blocks, model, actors (2, ``num_cpus=0.5``) and batches as the example, each
batch run by the plain model in ``map_batches``; nothing is saved. Prints the example's
``--json`` line (bench_distributed.py compares its wall time with the example's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "record_ray.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("record_ray", EXAMPLE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class _Plain:
    """One actor: the example's model, run on each batch; returns one row per batch."""

    def __init__(self, width: int, depth: int) -> None:
        self.model = _example().model(width, depth)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            out = self.model(torch.from_numpy(np.array(batch["data"])))
        return {"rows": np.array([len(out)])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--batches", 16), ("--batch-size", 32), ("--width", 256),
                          ("--depth", 2), ("--blocks", 4)):  # fmt: skip
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--json", action="store_true")  # always JSON; the example's flag
    args, _ = parser.parse_known_args()
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    example = _example()
    batches = [example.batch(i, args.batch_size).numpy() for i in range(args.batches)]
    per_block = -(-args.batches // args.blocks)
    blocks = [np.concatenate(batches[i : i + per_block]) for i in range(0, len(batches), per_block)]
    started = time.perf_counter()
    results = ray.data.from_numpy(blocks).map_batches(
        _Plain, fn_constructor_kwargs={"width": args.width, "depth": args.depth},
        batch_size=args.batch_size, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=0.5,
    )  # fmt: skip
    rows = sum(int(r["rows"]) for r in results.iter_rows())
    seconds = time.perf_counter() - started
    assert rows == args.batches * args.batch_size, rows
    print(json.dumps({"seconds": seconds, "samples_per_s": rows / seconds}))


if __name__ == "__main__":
    main()
