"""Run under ``torchrun``: ``instrument`` or ``record`` on a path shared by the ranks.

Arguments: ``instrument|record PATH SELECT [slow|whole]``: each rank takes the batches
``rank::world`` (``whole``: every rank the whole data); ``slow``: after its first batch a
rank waits (up to 120 s) for the file ``PATH.go`` (a recording that is still running when
a second run starts). Prints ``refused: <message>``
and exits 5 when the capture is refused.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import clouseau
from tests.distributed import workload


def main(kind: str, path: str, select: str, mode: str) -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = workload.batches() if mode == "whole" else workload.batches()[rank::world]
    chosen = select.split(",")
    try:
        if kind == "record":
            go, ran = Path(f"{path}.go"), []

            def slow(fmodel, batch):
                deadline = time.monotonic() + 120
                while mode == "slow" and ran and not go.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                ran.append(1)
                return fmodel(batch)

            clouseau.record(
                workload.model(), data, select=chosen, path=path, progress=False,
                max_size_mb=0.001, forward=slow,
            )  # fmt: skip
        else:
            fmodel = clouseau.instrument(workload.model(), select=chosen, path=path)
            with torch.no_grad(), fmodel:
                for batch in data:
                    fmodel(batch)
    except clouseau.ClouseauError as err:
        print(f"refused: {err}", flush=True)
        dist.destroy_process_group()
        return 5
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4], sys.argv[4] if len(sys.argv) > 4 else ""))
