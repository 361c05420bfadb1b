"""Multi-process JAX (``jax.distributed.initialize``): the processes as a :class:`Group`,
and globally sharded arrays brought to the host as the shards this process holds.

In JAX's multi-controller runtime every process runs every call (SPMD) on its own devices:
a value that is a globally sharded ``jax.Array`` is on no host whole. Each process writes
the shards it holds (replica 0 of each only: once per shard over all processes) with their
place in the global array (:mod:`clouseau.capture.jax.processes`, :mod:`clouseau.distributed.shards`), and ``clouseau.load``
reassembles the global array. The calls keep their numbers (every process makes them all).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from typing import Any

from clouseau.distributed.parts import Group

_GATHER_TIMEOUT_MS = 10 * 60 * 1000
_gathers = itertools.count()  # every process gathers in the same order: the n-th is one key


def _client() -> Any:
    if "jax" not in sys.modules:
        return None
    from clouseau.capture import frontend_named

    try:
        jax = frontend_named("jax")
    except ImportError:  # JAX without the frontend's extras: no JAX model to capture
        return None
    return jax.distributed_client()


def jax_group() -> Group | None:
    """The processes of ``jax.distributed``, or None when it is not initialized."""
    client = _client()
    if client is None:
        return None
    import jax

    rank, world = jax.process_index(), jax.process_count()

    def gather(summary: object) -> Sequence[object]:
        # The coordination service's key-value store: each process publishes its summary
        # and reads the others' (a barrier: it waits for every one).
        key = f"clouseau/gather/{next(_gathers)}"
        client.key_value_set(f"{key}/{rank}", json.dumps(summary))
        return [
            json.loads(client.blocking_key_value_get(f"{key}/{r}", _GATHER_TIMEOUT_MS))
            for r in range(world)
        ]

    return Group("jax.distributed", rank, world, gather, interleave=False)
