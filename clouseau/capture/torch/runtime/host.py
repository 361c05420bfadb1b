"""Saved values to the host: numpy arrays of the values a call saves (bf16 and float8
through their integer bits, as numpy has neither)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

from clouseau.capture.torch.lowering.lower import SaveTarget
from clouseau.capture.torch.tracing.specs import host_array
from clouseau.ir.errors import CaptureError
from clouseau.ir.sink import SavedBatch, Saves


def saved_values(
    targets: tuple[SaveTarget, ...],
    values: tuple[Any, ...],
    saves: Saves,
    *,
    first: bool = False,
) -> SavedBatch:
    """The values one call saves, paired with their targets (whose names and nodes are
    ``saves``, made once per entry: :func:`saves_of`). ``first``: the first run's values,
    private to it (no host copy needed)."""
    out = []
    # Runs in every call: a dense tensor of a numpy dtype is converted inline (to_numpy's
    # common case, one call fewer per value); anything else goes through _host.
    for target, value in zip(targets, values, strict=True):
        if type(value) is torch.Tensor and value.dtype not in _BITS and not value.is_meta:
            array = value.numpy(force=True)
            if target.host_copy and not first:
                array = array.copy()  # C order, as to_numpy's copy
            elif not array.flags.c_contiguous:
                array = np.asarray(array, order="C")
        else:
            array = _host(target, value, copy=target.host_copy and not first)
        out.append(array)
    return SavedBatch(saves, tuple(out))


def saves_of(targets: tuple[SaveTarget, ...]) -> Saves:
    """The names and nodes of ``targets``, as a sink takes them with each call's arrays."""
    return Saves(tuple(t.names for t in targets), tuple(t.node for t in targets))


def _host(target: SaveTarget, value: Any, *, copy: bool) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        return host_array(value)  # a Python scalar, a shape, None (torchvision's names)
    if value.is_meta:
        raise CaptureError(
            f"point {target.names[0]!r} is a meta tensor: it has a shape but no values "
            "to save. Run the model on a real device, or instrument it with select=None"
        )
    return to_numpy(value, copy=copy)


_BITS = {
    torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
}


#: The torch dtypes numpy has not, which go to the host through their integer bits.
THROUGH_BITS = frozenset(_BITS)


def to_numpy(t: torch.Tensor, *, copy: bool = True) -> np.ndarray:
    """A host array with the dtype, shape and values of ``t`` (C-contiguous).

    With ``copy=False`` a CPU tensor's memory is shared, not copied: only for tensors
    nothing else can write to once the call returns (see ``SaveTarget.host_copy``).
    """
    if t.dtype in _BITS:  # numpy has no bfloat16 nor float8: through integer bits
        bits, dtype = _BITS[t.dtype]
        t = t.detach().resolve_conj().resolve_neg()
        array = t.cpu().view(bits).numpy().view(dtype)
    else:
        # detach().cpu().resolve_conj().resolve_neg().numpy() in one call (a third faster).
        array = t.numpy(force=True)
    # ndarray.copy: the same C-ordered copy as np.array(..., order="C"), at half its cost.
    return array.copy(order="C") if copy else np.asarray(array, order="C")
