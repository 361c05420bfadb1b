"""Every private framework internal the exporters touch, in one place.

Exporters import no frontend (``tests/test_layering.py``), so they cannot borrow the torch
frontend's ``_compat.py``: when PyTorch moves one of these, this file and that one change.
"""

from __future__ import annotations

from typing import Any


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` by torch's pytree registry (how torch.export flattens outputs)."""
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(tree)
