"""torch.distributed: the initialized process group, if any, as a :class:`Group`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from clouseau.distributed.parts import Group


def torch_group() -> Group | None:
    """This rank's group when torch.distributed is initialized (torchrun), else None."""
    if "torch" not in sys.modules:  # never import torch for a JAX user
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()

    def gather(summary: object) -> Sequence[object]:
        # all_gather_object is a barrier too: no rank leaves before every part is closed.
        out: list[object] = [None] * world
        dist.all_gather_object(out, summary)
        return out

    return Group("torch.distributed", dist.get_rank(), world, gather)


def gather_sharded_parameters(model: Any, fmodel: Any) -> None:
    """Let ``fmodel`` run a model sharded with FSDP2 (``fully_shard``).

    The lowered graph reads the weights of the modules it inlines directly, without calling
    them, so FSDP's own hooks (which all-gather a module's shards before its forward)
    would not run. Each call of ``fmodel`` instead gathers every sharded module's
    parameters before, and frees them after: the points inside a sharded module are the
    full activations of this rank's batch, at the memory cost of the full parameters for
    the duration of one call. Meant for inference (``torch.no_grad``): the gradients are
    not reduce-scattered.
    """
    if "torch" not in sys.modules or not isinstance(model, sys.modules["torch"].nn.Module):
        return
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return
    sharded = tuple(m for m in model.modules() if isinstance(m, FSDPModule))
    if not sharded:
        return

    def unshard(*_: Any) -> None:
        for module in sharded:  # the root first: it initializes FSDP's state
            module.unshard()

    def reshard(*_: Any) -> None:
        for module in sharded:
            module.reshard()

    fmodel.register_forward_pre_hook(unshard)
    fmodel.register_forward_hook(reshard)
