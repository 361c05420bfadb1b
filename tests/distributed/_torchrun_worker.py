"""Run under ``torchrun --nproc-per-node 2``: capture the workload with DDP or FSDP2.

Arguments: ``ddp|fsdp|plain PATH [DIE_AFTER]``: each rank takes the batches ``rank::world``
(the user's own split, by batch index); with DIE_AFTER, rank 1 dies (``os._exit``) after
that many batches.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import clouseau
from tests.distributed import workload


def main(mode: str, path: str, die_after: int | None) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = workload.model()
    if mode == "fsdp":
        fully_shard(net.block)
        fully_shard(net)
    fmodel = clouseau.instrument(net, select=workload.SELECT, path=path, max_size_mb=0.001)
    runner = torch.nn.parallel.DistributedDataParallel(fmodel) if mode == "ddp" else fmodel
    with torch.no_grad():
        for done, batch in enumerate(workload.batches()[rank::world]):
            if rank == 1 and die_after is not None and done == die_after:
                fmodel.flush()
                _wait_for_rank_0_closed(path)  # else torchrun may end rank 0 before it closes
                os._exit(3)
            runner(batch)
    fmodel.close()
    # DDP's reducer still holds gloo work whose Python callback would wait for the GIL
    # while destroy_process_group joins gloo's threads holding it (a torch deadlock).
    del runner
    dist.barrier()
    dist.destroy_process_group()


def _wait_for_rank_0_closed(path: str, timeout: float = 120.0) -> None:
    status = Path(path) / "rank-00000" / "status.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(status.read_text()).get("closed"):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
