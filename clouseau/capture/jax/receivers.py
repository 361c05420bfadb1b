"""The host-callback receivers of the JAX saves: numbered calls, split iterations, kept branches.

Functions here receive numpy-convertible arrays from ``jax.device_get`` or from a host
callback (:func:`~clouseau.capture.jax.lower.emitter`) and hand
:class:`~clouseau.ir.sink.SavedValue` s to the sink. The arrays of one delivery are the
values of some slot ids of a :class:`~clouseau.capture.jax.plan.Plan`, in order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from clouseau.capture._common import SinkCall
from clouseau.capture.jax.plan import Plan, Slot
from clouseau.ir.sink import SavedValue, Shards, Sink

# Where each value of a callback is in its packed arguments: (argument, offset, shape).
Layout = tuple[tuple[int, int, tuple[int, ...]], ...]


def cut(layout: Layout, packed: Sequence[Any]) -> list[np.ndarray]:
    """The values packed by :func:`~clouseau.capture.jax.lower.pack`, as views."""
    flat = [np.asarray(p) for p in packed]
    return [
        flat[arg][offset : offset + math.prod(shape)].reshape(shape)
        for arg, offset, shape in layout
    ]


def unpack(fn: Callable[..., None], nbatch: int, layout: Layout, call: Any, *packed: Any) -> None:
    """Call ``fn(nbatch, call, *values)`` with the values cut out of the packed arrays."""
    fn(nbatch, call, *cut(layout, packed))


def begin(sink: Sink) -> np.ndarray:
    return np.int32(sink.begin_call())


def deliver(
    sink: Sink,
    graph_id: int,
    plan: Plan,
    ids: tuple[int, ...],
    nbatch: int,
    call: Any,
    *arrays: Any,
) -> None:
    """Hand one call's saved arrays (slots ``ids``) to the sink and end the call.

    ``call`` is the index taken with ``sink.begin_call()`` when the run started (so that a
    failing run is recorded); a negative one (a callback of a model without streams)
    begins the call here.
    """
    given = int(np.max(call))
    with SinkCall(sink, given if given >= 0 else None) as call:
        sink.put(call, graph_id, saved_values(plan, ids, arrays, nbatch))


def put_stream(
    sink: Sink,
    graph_id: int,
    plan: Plan,
    ids: tuple[int, ...],
    ncounters: int,
    nbatch: int,
    call: Any,
    *arrays: Any,
) -> None:
    """One iteration of a while loop: its values, numbered by the enclosing iterations."""
    # Under vmap an example that has left the loop keeps its old count; the running
    # iteration is the largest.
    counters = tuple(int(np.max(c)) for c in arrays[:ncounters])
    values = saved_values(plan, ids, arrays[ncounters:], nbatch, counters)
    sink.put(int(np.max(call)), graph_id, values)


def saved_values(
    plan: Plan,
    ids: tuple[int, ...],
    arrays: Sequence[Any],
    nbatch: int,
    prefix: tuple[int, ...] = (),
) -> list[SavedValue]:
    """The named values of one delivery: iterations split, untaken branches dropped."""
    # No copies: the arrays come from device_get or a host callback and view immutable
    # JAX buffers, which nothing can write to while the sink holds them.
    # A value sharded over processes (jax.distributed) stays the shards held here.
    by_id = {
        i: a if isinstance(a, Shards) else np.asarray(a) for i, a in zip(ids, arrays, strict=True)
    }
    values: list[SavedValue] = []
    for i, array in by_id.items():
        slot = plan.slots[i]
        if not slot.names:
            continue
        for index in np.ndindex(*array.shape[nbatch : nbatch + slot.loops]):
            if _taken(plan, slot, by_id, nbatch, index):
                lead = (slice(None),) * nbatch
                value = array[(*lead, *index)] if index else array
                values.append(SavedValue(slot.names, slot.node, value, (*prefix, *index)))
    return values


def _taken(
    plan: Plan, slot: Slot, by_id: dict[int, np.ndarray], nbatch: int, index: tuple[int, ...]
) -> bool:
    # Under vmap a batched cond runs every branch; a branch's values are kept when at
    # least one example took it.
    lead = (slice(None),) * nbatch
    for guard, branch in slot.guards:
        taken = by_id[guard][(*lead, *index[: plan.slots[guard].loops])]
        if not np.any(taken == branch):
            return False
    return True
