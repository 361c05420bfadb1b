"""Record a model's activations over a Ray Data dataset with 2 actors; load reads one capture.

    python examples/record_ray.py /tmp/ray-run

Starts a local Ray cluster (2 CPUs), or joins the one ``RAY_ADDRESS`` names (``auto``: the
one ``ray start --head`` started on this machine). Each actor builds the MLP once
(``model``), instruments it and writes every batch it runs as one block file of its own
part; ``clouseau.load`` reads the blocks in the order of the data, call ``i`` being batch
``i``: the same batches as ``examples/record_torchrun.py``. ``--json`` prints the timing
(used by bench/).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import ray
import torch

import clouseau


def model(width: int = 256, depth: int = 2) -> torch.nn.Module:
    """An MLP of ``depth`` hidden layers; the points ``1`` and ``3`` are the first two's GELUs."""
    torch.manual_seed(0)
    hidden = [torch.nn.Linear(64, width), torch.nn.GELU()]
    for _ in range(depth - 1):
        hidden += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*hidden, torch.nn.Linear(width, 64)).eval()


def batch(index: int, size: int) -> torch.Tensor:
    return torch.randn(size, 64, generator=torch.Generator().manual_seed(index))


class Factory:
    """Builds the model in each actor (pickled to them, so a module-level class)."""

    def __init__(self, width: int, depth: int) -> None:
        self.width, self.depth = width, depth

    def __call__(self) -> torch.nn.Module:
        return model(self.width, self.depth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="/tmp/clouseau-ray")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=2, help="hidden layers (at least 2)")
    parser.add_argument("--blocks", type=int, default=4, help="Ray Data blocks of the data")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    if not ray.is_initialized():
        # RAY_ADDRESS: join a running cluster (`ray start --head`, a Ray job); else start one.
        local = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": 2, "include_dashboard": False}
        ray.init(log_to_driver=False, **local)
    ray.data.DataContext.get_current().enable_progress_bars = False
    # A list of arrays is a block each, in order: --blocks blocks of whole batches.
    batches = [batch(i, args.batch_size).numpy() for i in range(args.batches)]
    per_block = -(-args.batches // args.blocks)
    blocks = [np.concatenate(batches[i : i + per_block]) for i in range(0, len(batches), per_block)]
    dataset = ray.data.from_numpy(blocks)
    started = time.perf_counter()
    cap = clouseau.ray.record(
        dataset,
        Factory(args.width, args.depth),
        select=["1", "3"],
        path=args.path,
        concurrency=2,
        batch_size=args.batch_size,
        num_cpus=0.5,  # leave CPU to Ray Data's own tasks on a small machine
    )
    seconds = time.perf_counter() - started
    if args.json:
        samples = args.batches * args.batch_size
        print(json.dumps({"seconds": seconds, "samples_per_s": samples / seconds}))
        return
    net = model(args.width, args.depth)
    with torch.no_grad():  # batch 3, by the eager model: the same as the capture's call 3
        expected = net[1](net[0](batch(3, args.batch_size)))
    np.testing.assert_allclose(cap.get("1", call=3), expected.numpy(), rtol=1e-5, atol=1e-6)
    print(f"{cap}: batches {[(b.start, b.stop) for b in cap.batches[:3]]}...")


if __name__ == "__main__":
    main()
