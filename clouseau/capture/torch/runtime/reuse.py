"""Lowered graphs kept across instrumented models, so building one again costs no trace.

``with clouseau.instrument(model, select=...)`` per batch used to trace, rewrite and lower
the model again on every first call (some 0.5 s for the quickstart model, 60 forwards).
A new instrumented model of a model already seen, with the same selection and the same
call signature, now reuses the :class:`Lowered` an earlier one derived: its first call
runs the compiled graph, as every later call of the first instrumented model does.

The key is what a second call of one instrumented model is keyed on (the call signature
and the modules' state, :meth:`InstrumentedModule._key`), plus the selection and the
identity of every module, parameter and buffer: a module or weight replaced since is a
new graph. Only selections that compare by value are reused (a glob, a list of globs,
``None``), and never with interventions or gradients (their actions are objects of the
user's). At most :data:`MAX_MODELS` graphs are kept, the oldest dropped first; an entry
keeps its model's modules alive until then.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import torch

from clouseau.capture.torch.lowering.lower import Lowered

MAX_MODELS = 8

_CACHE: OrderedDict[Hashable, tuple[weakref.ref[torch.nn.Module], Lowered]] = OrderedDict()
_LOCK = threading.Lock()


def reuse_key(
    model: torch.nn.Module,
    call_key: Hashable,
    select: Any,
    reusable: bool,
    dynamic: bool,
) -> Hashable | None:
    """The key of a lowered graph of ``model`` for this call, or None if it is not kept."""
    selection = _selection(select)
    if not reusable or selection is None:
        return None
    key = (id(model), _identity(model), call_key, selection, dynamic)
    try:
        hash(key)
    except TypeError:  # an argument whose key is not hashable: not kept
        return None
    return key


def lookup(key: Hashable | None, model: torch.nn.Module) -> Lowered | None:
    """The kept graph of ``key``, if its model is ``model`` (ids are reused after a free)."""
    if key is None:
        return None
    with _LOCK:
        found = _CACHE.get(key)
        if found is None or found[0]() is not model:
            return None
        _CACHE.move_to_end(key)
        return found[1]


def keep(key: Hashable | None, model: torch.nn.Module, lowered: Lowered) -> None:
    """Keep ``lowered`` under ``key`` (after its first run: the graph holds no call's data)."""
    if key is None:
        return
    with _LOCK:
        _CACHE[key] = (weakref.ref(model), lowered)
        _CACHE.move_to_end(key)
        while len(_CACHE) > MAX_MODELS:
            _CACHE.popitem(last=False)


def _identity(model: torch.nn.Module) -> tuple[int, ...]:
    """The ids of every module and of each one's own parameters and buffers, in one walk
    of the tree (``parameters()`` and ``buffers()`` would walk it again each)."""
    ids: list[int] = []
    for module in model.modules():
        ids.append(id(module))
        ids.extend(map(id, module.parameters(recurse=False)))
        ids.append(-1)  # parameters end here: a weight moved to a buffer is a new key
        ids.extend(map(id, module.buffers(recurse=False)))
    return tuple(ids)


def _selection(select: Any) -> Hashable | None:
    """``select`` as a value to compare, or None where it compares by identity only."""
    if select is None:
        return ("<none>",)
    if isinstance(select, str):
        return ("<glob>", select)
    if isinstance(select, list | tuple) and all(isinstance(s, str) for s in select):
        return ("<globs>", *select)
    return None
