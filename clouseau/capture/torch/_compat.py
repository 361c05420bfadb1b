"""Every private PyTorch internal the torch frontend touches, in one place.

When a PyTorch release moves one of these, this is the only file to change.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as _pytree

TreeSpec = _pytree.TreeSpec


def tensor_version(t: torch.Tensor) -> int:
    """The in-place modification counter of ``t`` (shared by a tensor and its views)."""
    return t._version


def tree_flatten(tree: Any) -> tuple[list[Any], TreeSpec]:
    """Flatten with torch's pytree registry (the one torch.export used for in/out specs)."""
    return _pytree.tree_flatten(tree)


def tree_unflatten(leaves: list[Any], spec: TreeSpec) -> Any:
    return _pytree.tree_unflatten(leaves, spec)


def tree_leaves(tree: Any) -> list[Any]:
    return _pytree.tree_leaves(tree)


def is_registered_node(value: Any) -> bool:
    """Whether ``value``'s type is a pytree node registered by a library (a cache object)."""
    return type(value) in _pytree.SUPPORTED_NODES


def is_op_overload(target: Any) -> bool:
    """Whether an fx call target is an ATen operator (``torch.ops.aten.add.Tensor``)."""
    return isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket)


def register_cache_pytrees(model: torch.nn.Module) -> None:
    """Make Hugging Face cache objects (``DynamicCache``, ...) pytrees, for torch.export.

    A transformers model's default call builds and returns a cache; torch.export refuses
    an output type it cannot flatten. transformers' own exporter registers every ``Cache``
    subclass (and the model module's ``*Cache`` classes); registering twice is a no-op.
    Models of other libraries are left alone.
    """
    if not type(model).__module__.startswith("transformers."):
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:  # another transformers release: leave the caches as they are
        return
    register_cache_pytrees_for_model(model)
