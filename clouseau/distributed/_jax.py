"""Multi-process JAX (``jax.distributed.initialize``): detected, and refused for now.

In JAX's multi-controller runtime every process runs every call on its own shards, so a
capture would need each process to write the shards it holds of a globally sharded
array (and the reader to reassemble them). That is not built yet: rather than write every
value once per process, or fail inside ``device_get`` on an array no process holds
whole, an instrumented model with a path refuses to start, naming the way around it.
"""

from __future__ import annotations

import sys

from clouseau.distributed.parts import Group
from clouseau.ir.errors import CaptureError


def jax_group() -> Group | None:
    """None when ``jax.distributed`` is not initialized; CaptureError when it is."""
    if "jax" not in sys.modules:
        return None
    try:
        from clouseau.capture.jax._compat import distributed_client
    except ImportError:  # JAX without the frontend's extras: no JAX model to capture
        return None
    if distributed_client() is None:
        return None
    raise CaptureError(
        "clouseau cannot write a capture from several JAX processes yet "
        "(jax.distributed is initialized): capture in one process, or pass path=None "
        "and save what you need from jax.experimental.multihost_utils.process_allgather "
        "of the values; see docs/distributed.md"
    )
