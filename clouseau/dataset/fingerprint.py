"""Digests that tell whether a resumed recording runs the same model over the same data.

A model's digest covers its class, the names, shapes and dtypes of its parameters and
buffers, and a strided sample of at most 4096 values of each, so that retrained weights are
caught without hashing gigabytes. A batch's digest covers the shapes and dtypes of its
arrays and a strided sample of their bytes.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

_SAMPLE = 4096
_BATCH_BYTES = 1 << 20


def model_digest(model: Any) -> str:
    """A digest of ``model``'s type and weights (torch module, Equinox module, function)."""
    h = hashlib.blake2b(digest_size=16)
    kind = type(model)
    h.update(f"{kind.__module__}.{kind.__qualname__}".encode())
    code = getattr(model, "__code__", None)
    if code is not None:  # a plain function: its code, not its identity
        h.update(f"{model.__module__}.{model.__qualname__}".encode())
        h.update(code.co_code)
    for name, array in _weights(model):
        h.update(f"{name}:{array.dtype}:{array.shape}".encode())
        flat = array.reshape(-1)
        step = max(1, flat.size // _SAMPLE)
        h.update(np.ascontiguousarray(flat[::step][:_SAMPLE]).tobytes())
    return h.hexdigest()


def _weights(model: Any) -> Iterator[tuple[str, np.ndarray]]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        for name, tensor in model.state_dict().items():
            if isinstance(tensor, torch.Tensor):
                yield name, _torch_numpy(tensor)
        return
    jax = sys.modules.get("jax")
    if jax is not None:
        leaves = jax.tree_util.tree_leaves_with_path(model)
        for keypath, leaf in leaves:
            if isinstance(leaf, jax.Array | np.ndarray):
                yield jax.tree_util.keystr(keypath), np.asarray(leaf)


def _torch_numpy(tensor: Any) -> np.ndarray:
    import torch

    t = tensor.detach().cpu()
    return (t.float() if t.dtype is torch.bfloat16 else t).numpy()


def batch_digest(batch: Any) -> str:
    """A digest of one batch's arrays (shapes, dtypes and a strided sample of the bytes)."""
    h = hashlib.blake2b(digest_size=12)
    for array in leaves(batch):
        h.update(f"{array.dtype}:{array.shape}".encode())
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        step = max(1, raw.size // _BATCH_BYTES)
        h.update(np.ascontiguousarray(raw[::step]).tobytes())
    return h.hexdigest()


def leaves(batch: Any) -> Iterator[np.ndarray]:
    """The arrays of a batch (nested dicts, lists, tuples of tensors/arrays), as numpy."""
    if isinstance(batch, Mapping):
        for key in batch:
            yield from leaves(batch[key])
    elif isinstance(batch, list | tuple):
        for item in batch:
            yield from leaves(item)
    elif hasattr(batch, "shape") and hasattr(batch, "dtype"):
        yield to_numpy(batch)


def to_numpy(value: Any) -> np.ndarray:
    """A numpy view or copy of a torch tensor, JAX array or numpy array."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dtype is torch.bfloat16:
            return value.detach().cpu().float().numpy()
        return value.numpy(force=True)
    return np.asarray(value)
