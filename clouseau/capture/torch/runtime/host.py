"""Saved values to the host: numpy arrays of the values a call saves (bf16 and float8
through their integer bits, as numpy has neither)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import torch

from clouseau.capture.torch.lowering.lower import SaveTarget
from clouseau.capture.torch.tracing.specs import host_array
from clouseau.ir.errors import CaptureError
from clouseau.ir.sink import SavedBatch, Saves


@dataclass(frozen=True)
class HostPlan:
    """Which saved values of an entry get a host copy (``copy_at``) and which are handed
    over sharing their memory (``private_at``): positions, read by every call."""

    copies: tuple[bool, ...]
    copy_at: tuple[int, ...]
    private_at: tuple[int, ...]


def host_plan(copies: tuple[bool, ...]) -> HostPlan:
    """The plan of saved values whose ``host_copy`` flags are ``copies``."""
    return HostPlan(
        copies,
        tuple(i for i, c in enumerate(copies) if c),
        tuple(i for i, c in enumerate(copies) if not c),
    )


_FAILS = (AttributeError, TypeError, RuntimeError, NotImplementedError)


def saved_values(
    targets: tuple[SaveTarget, ...],
    values: tuple[Any, ...],
    saves: Saves,
    *,
    first: bool = False,
    plan: HostPlan | None = None,
) -> SavedBatch:
    """The values one call saves, paired with their targets (whose names and nodes are
    ``saves``, made once per entry: :func:`saves_of`). ``first``: the first run's values,
    private to it (no host copy needed). ``plan``: the targets' :func:`host_plan`, as the
    entry keeps it (made here if not given).

    A private value that is not C-contiguous (a transpose, a slice) is handed over as the
    strided view it is where its storage is kept anyway (a view of another saved value,
    or a permutation of its whole storage): a sink orders it when it stores or reads it,
    and the values are the same. Copying it here would hold every such view twice.
    """
    if first or plan is None:
        plan = host_plan((False,) * len(values) if first else tuple(t.host_copy for t in targets))
    try:
        # Runs in every call. numpy() shares the memory of a CPU tensor that needs no
        # detach nor resolve, in one C call; numpy(force=True) takes any dense tensor of a
        # numpy dtype; anything else (bf16, meta, a Python scalar) takes _slow.
        arrays = [v.numpy() for v in values]
    except _FAILS:
        try:
            arrays = [v.numpy(force=True) for v in values]
        except _FAILS:
            return SavedBatch(saves, _slow(targets, values, plan.copies))
    for i in plan.copy_at:
        arrays[i] = arrays[i].copy()  # C order, as to_numpy's copy
    for i in plan.private_at:
        if not arrays[i].flags.c_contiguous:
            _order_strided(arrays, values, plan.copies)
            break
    return SavedBatch(saves, tuple(arrays))


def _slow(
    targets: tuple[SaveTarget, ...], values: tuple[Any, ...], copies: tuple[bool, ...]
) -> tuple[Any, ...]:
    """The host arrays of a call with a value the fast path does not take (bf16, float8,
    meta tensors, Python scalars), each converted on its own."""
    arrays = [
        _host(target, value, copy=copy)
        for target, value, copy in zip(targets, values, copies, strict=True)
    ]
    _order_strided(arrays, values, copies)
    return tuple(arrays)


def _order_strided(arrays: list[Any], values: tuple[Any, ...], copies: tuple[bool, ...]) -> None:
    """Copy into C order each private strided array of a CPU tensor whose storage nothing
    else keeps (a slice of a value not saved: keeping the view would keep all its base).
    Off the CPU, the array is a copy on the host already, as compact as the value."""
    shared = [
        (i, v)
        for i, (v, copy) in enumerate(zip(values, copies, strict=True))
        if not copy and isinstance(v, torch.Tensor) and v.device.type == "cpu"
    ]
    kept = {_storage(v) for i, v in shared if arrays[i].flags.c_contiguous and _whole(v)}
    for i, v in shared:
        if not arrays[i].flags.c_contiguous and not (_whole(v) or _storage(v) in kept):
            arrays[i] = np.asarray(arrays[i], order="C")


def _whole(value: torch.Tensor) -> bool:
    """Whether ``value`` spans all of its storage (a permutation of it, or all of it)."""
    return value.untyped_storage().nbytes() == value.numel() * value.element_size()


def _storage(value: torch.Tensor) -> int:
    return value.untyped_storage().data_ptr()


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
    return to_numpy(value) if copy else _shared(value)


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
    array = _shared(t)
    # ndarray.copy: the same C-ordered copy as np.array(..., order="C"), at half its cost.
    return array.copy(order="C") if copy else np.asarray(array, order="C")


def _shared(t: torch.Tensor) -> np.ndarray:
    """The host array of ``t``, sharing a CPU tensor's memory (and its strides)."""
    if t.dtype in _BITS:  # numpy has no bfloat16 nor float8: through integer bits
        bits, dtype = _BITS[t.dtype]
        t = t.detach().resolve_conj().resolve_neg()
        return t.cpu().view(bits).numpy().view(dtype)
    # detach().cpu().resolve_conj().resolve_neg().numpy() in one call (a third faster).
    return t.numpy(force=True)
