"""Digests that tell whether a resumed recording runs the same model over the same data.

A model's digest covers its class, the names, shapes and dtypes of its parameters and
buffers, and every byte of each: a change that a sample would miss (one zeroed column of a
large layer) is caught. It costs one pass of BLAKE2b over the weights (512 MiB in 1.2 s on
one core here, docs/datasets.md), paid once per ``record`` call. A batch's digest covers the shapes and dtypes of its
arrays and a strided sample of their bytes.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

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
    for name, dtype, shape, raw in _weights(model):
        h.update(f"{name}:{dtype}:{shape}".encode())
        h.update(raw)
    return h.hexdigest()


Weight = tuple[str, str, tuple[int, ...], memoryview]


def _weights(model: Any) -> Iterator[Weight]:
    """Each weight's name, dtype, shape and bytes (a view, no copy where it can)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        for name, tensor in model.state_dict().items():
            if isinstance(tensor, torch.Tensor):
                t = tensor.detach().cpu().contiguous().reshape(-1)
                # Bytes through uint8: exact for every dtype, bf16 and float8 included.
                raw = t.view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
                yield name, str(tensor.dtype), tuple(tensor.shape), memoryview(raw)
        return
    jax = sys.modules.get("jax")
    if jax is not None:
        leaves = jax.tree_util.tree_leaves_with_path(model)
        for keypath, leaf in leaves:
            if isinstance(leaf, jax.Array | np.ndarray):
                array = np.ascontiguousarray(np.asarray(leaf))
                raw = memoryview(array.reshape(-1).view(np.uint8))
                yield jax.tree_util.keystr(keypath), str(array.dtype), array.shape, raw


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
