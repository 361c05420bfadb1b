"""Multi-process JAX (``jax.distributed.initialize``) as a :class:`Group`.

Every process runs every call of the model on its own shards (multi-controller SPMD), so
calls keep their numbers and each process writes the shards it holds.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from itertools import count

from clouseau.distributed.parts import Group

_GATHERS = count()


def jax_group() -> Group | None:
    """This process's group when ``jax.distributed`` is initialized, else None."""
    if "jax" not in sys.modules:
        return None
    from clouseau.capture.jax._compat import distributed_client

    client = distributed_client()
    if client is None:
        return None
    import jax

    rank, world = jax.process_index(), jax.process_count()

    def gather(summary: object) -> Sequence[object]:
        # Through the coordination service's key-value store: no device collective, so a
        # process whose devices are busy or gone still answers.
        key = f"clouseau/gather/{next(_GATHERS)}"
        client.key_value_set(f"{key}/{rank}", json.dumps(summary))
        client.wait_at_barrier(f"{key}/barrier", 600_000)
        return [
            json.loads(client.blocking_key_value_get(f"{key}/{r}", 600_000)) for r in range(world)
        ]

    return Group("jax.distributed", rank, world, gather, interleave=False)
