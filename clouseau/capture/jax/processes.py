"""Values of a multi-process JAX run (``jax.distributed.initialize``) brought to the host.

In JAX's multi-controller runtime a value that is a globally sharded ``jax.Array`` is on
no host whole: each process hands the sink the shards it holds (replica 0 of each only,
so every shard is written once over all processes) as a :class:`~clouseau.ir.sink.Shards`;
the distributed store writes them with their place and reassembles the global array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from clouseau.capture.jax._compat import distributed_client
from clouseau.ir.sink import Bounds, Shards


def multiprocess() -> bool:
    """Whether this process is one of several of ``jax.distributed``."""
    return distributed_client() is not None


def to_host(values: Sequence[Any]) -> list[Any]:
    """``jax.device_get`` of each value; a value no process holds whole becomes the
    :class:`Shards` this process writes (replica 0 of each shard it holds)."""
    out: list[Any] = []
    for value in values:
        if not isinstance(value, jax.Array) or value.is_fully_addressable:
            out.append(jax.device_get(value))
            continue
        held = tuple(
            (_bounds(shard.index, value.shape), np.asarray(shard.data))
            for shard in value.addressable_shards
            if shard.replica_id == 0
        )
        out.append(Shards(tuple(value.shape), np.dtype(value.dtype), held))
    return out


def _bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> Bounds:
    return tuple(
        (s.start or 0, dim if s.stop is None else s.stop)
        for s, dim in zip(index, shape, strict=True)
    )
