"""Run under ``torchrun --nproc-per-node 2``: ``clouseau.record`` of each rank's share.

Arguments: ``PATH [DIE_AFTER|resume]``: each rank records the batches ``rank::world``;
with DIE_AFTER, rank 1 dies (``os._exit``) when it asks for that batch; ``resume``
continues an interrupted run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist

import clouseau
from tests.distributed import workload


def share(rank: int, world: int, die_after: int | None) -> Iterator[torch.Tensor]:
    for done, batch in enumerate(workload.batches()[rank::world]):
        if rank == 1 and done == die_after:
            os._exit(3)
        yield batch


class Share:
    """The rank's batches, with a length (record checks it when resuming)."""

    def __init__(self, rank: int, world: int, die_after: int | None) -> None:
        self.rank, self.world, self.die_after = rank, world, die_after

    def __len__(self) -> int:
        return len(workload.batches()[self.rank :: self.world])

    def __iter__(self) -> Iterator[torch.Tensor]:
        return share(self.rank, self.world, self.die_after)


def main(path: str, mode: str | None) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    die_after = int(mode) if mode and mode.isdigit() else None
    clouseau.record(
        workload.model(),
        Share(rank, world, die_after),
        select=workload.SELECT,
        path=path,
        resume=mode == "resume",
        progress=False,
        max_size_mb=0.001,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
