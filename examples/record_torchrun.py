"""Capture a model over a dataset with torchrun: each rank writes its part, load reads one.

    torchrun --standalone --nproc-per-node 2 examples/record_torchrun.py /tmp/run
    python -c "import clouseau; print(clouseau.load('/tmp/run'))"

Each rank takes every ``world_size``-th batch (batch ``k * world_size + rank`` is its
``k``-th call, the numbering clouseau gives it), so the merged capture has one call per
batch index, as one process over all the batches would. ``--fsdp`` shards the model
with FSDP2 (``fully_shard``) first; ``--json`` prints the timing (used by bench/): the
whole run, the first call (instrument and trace), and the samples per second after it.
Run with plain ``python`` it is one process over all the batches.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch
import torch.distributed as dist

import clouseau


def model(width: int, depth: int = 2) -> torch.nn.Module:
    """An MLP of ``depth`` hidden layers; the points ``1`` and ``3`` are the first two's GELUs."""
    torch.manual_seed(0)
    hidden = [torch.nn.Linear(64, width), torch.nn.GELU()]
    for _ in range(depth - 1):
        hidden += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*hidden, torch.nn.Linear(width, 64)).eval()


def batch(index: int, size: int) -> torch.Tensor:
    return torch.randn(size, 64, generator=torch.Generator().manual_seed(index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="/tmp/clouseau-torchrun")
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=2, help="hidden layers (at least 2)")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    distributed = "RANK" in __import__("os").environ  # started by torchrun
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    net = model(args.width, args.depth)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(net)
    started = time.perf_counter()
    fmodel = clouseau.instrument(net, select=["1", "3"], path=args.path)
    mine = range(rank, args.batches, world)  # this rank's share of the batches
    with torch.no_grad(), fmodel:
        fmodel(batch(mine[0], args.batch_size))  # the first call traces: timed apart
        if distributed:
            dist.barrier()
        steady = time.perf_counter()
        for index in mine[1:]:
            fmodel(batch(index, args.batch_size))
    ended = time.perf_counter()  # closing waits for every rank (the manifest)
    if distributed:
        dist.destroy_process_group()
    # The models go while Python runs, not at interpreter exit. (The gloo group's own
    # threads outlive destroy_process_group once torch.export has traced a model in this
    # process, with or without clouseau; clouseau leaves no thread of its own running.)
    del fmodel, net
    gc.collect()
    if rank == 0:
        cap = clouseau.load(args.path)
        if args.json:  # throughput after the first call of each rank
            samples = (args.batches - world) * args.batch_size
            times = {"seconds": ended - started, "first_s": steady - started}
            print(json.dumps(times | {"samples_per_s": samples / (ended - steady)}))
        elif distributed:
            print(f"{cap}: calls {cap.calls[:4]}..., ranks {[cap.rank(c) for c in cap.calls[:4]]}")
        else:
            print(f"{cap}: calls {cap.calls[:4]}...")


if __name__ == "__main__":
    main()
