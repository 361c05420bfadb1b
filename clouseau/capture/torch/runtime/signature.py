"""The keys of a call's inputs: the exact signature (sizes and strides, for the memo of
per-call plans) and the structure a trace depends on (ranks, dtypes, devices: not sizes)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves

from clouseau.capture.torch._compat import is_registered_node


def exact_key(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        # torch.Size is a tuple: hashable as it is.
        return ("T", value.shape, value.stride(), value.dtype, value.device)
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(map(exact_key, value)))
    if isinstance(value, dict):
        return ("dict", tuple((k, exact_key(v)) for k, v in value.items()))
    if is_registered_node(value):
        # A cache object is keyed by what it holds (it grows in place between calls).
        leaves, spec = tree_flatten(value)
        return ("tree", type(value), str(spec), tuple(map(exact_key, leaves)))
    return _value_key(value)


def structure_key(value: Any) -> Hashable:
    """What a trace depends on: a tensor's rank, dtype and device, not its sizes."""
    if isinstance(value, torch.Tensor):
        return ("T", value.dim(), value.dtype, value.device)
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(map(structure_key, value)))
    if isinstance(value, dict):
        return ("dict", tuple((k, structure_key(v)) for k, v in value.items()))
    if is_registered_node(value):
        leaves, spec = tree_flatten(value)
        return ("tree", type(value), str(spec), tuple(map(_leaf_structure, leaves)))
    return _value_key(value)


def _leaf_structure(leaf: Any) -> Hashable:
    # An int leaf of a cache is a counter that grows every step (``_compat`` lifts it out
    # of the spec): an input of the graph, like a size, not part of the structure.
    return ("int",) if type(leaf) is int else structure_key(leaf)


def _value_key(value: Any) -> Hashable:
    try:
        hash(value)
    except TypeError:
        return ("repr", type(value).__name__, repr(value))
    return ("V", type(value), value)


# Exact signatures remembered (a dict hit per call); past it the memo starts over.
MAX_SIGNATURES = 4096


def tensors_of(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def storage_of(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())
