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


def is_op_overload(target: Any) -> bool:
    """Whether an fx call target is an ATen operator (``torch.ops.aten.add.Tensor``)."""
    return isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket)
