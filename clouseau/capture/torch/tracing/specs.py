"""The IR spec of a runtime value, and the numpy array a non-tensor point saves."""

from __future__ import annotations

from typing import Any

import torch

from clouseau.ir.graph import DType, OpaqueSpec, Spec, TensorSpec

_SCALARS = {bool: DType.BOOL, int: DType.INT64, float: DType.FLOAT64}
_NUMPY = {DType.BOOL: "bool", DType.INT64: "int64", DType.FLOAT64: "float64"}


def is_plain_value(value: Any) -> bool:
    """Whether ``value`` is a Python scalar, a tuple of ints (a shape) or ``None``."""
    return (
        type(value) in _SCALARS
        or value is None
        or (isinstance(value, tuple) and all(type(v) is int for v in value))
    )


def host_array(value: Any) -> Any:
    """The numpy array a non-tensor point saves (:func:`spec_of` gives its spec)."""
    import numpy as np

    if value is None:
        return np.zeros((0,), dtype="float32")
    scalar = _SCALARS.get(type(value))
    return np.asarray(value, dtype=_NUMPY[scalar] if scalar is not None else "int64")


_DTYPES = {
    torch.bool: DType.BOOL, torch.uint8: DType.UINT8, torch.int8: DType.INT8,
    torch.int16: DType.INT16, torch.int32: DType.INT32, torch.int64: DType.INT64,
    torch.float16: DType.FLOAT16, torch.bfloat16: DType.BFLOAT16, torch.float32: DType.FLOAT32,
    torch.float64: DType.FLOAT64, torch.complex64: DType.COMPLEX64,
    torch.complex128: DType.COMPLEX128, torch.uint16: DType.UINT16, torch.uint32: DType.UINT32,
    torch.uint64: DType.UINT64, torch.float8_e4m3fn: DType.FLOAT8_E4M3FN,
    torch.float8_e5m2: DType.FLOAT8_E5M2,
}  # fmt: skip


def spec_of(value: Any) -> Spec:
    """The IR spec of a runtime value; tensors of dtypes the IR lacks are opaque.

    A Python scalar is a 0-d array (``bool``, ``int64``, ``float64``), a shape or tuple of
    ints a 1-d ``int64`` array, and ``None`` an empty ``float32`` array: such values are
    points (torchvision names them) that save as those arrays (see :func:`host_array`).
    """
    scalar = _SCALARS.get(type(value))
    if scalar is not None:
        return TensorSpec((), scalar)
    if value is None:
        return TensorSpec((0,), DType.FLOAT32)
    if isinstance(value, tuple) and all(type(v) is int for v in value):
        return TensorSpec((len(value),), DType.INT64)
    if isinstance(value, torch.Tensor):
        dtype = _DTYPES.get(value.dtype)
        if dtype is not None and not value.is_sparse and not value.is_quantized:
            return TensorSpec(tuple(int(d) for d in value.shape), dtype)
        return OpaqueSpec(f"Tensor[{value.dtype}]".replace("torch.", ""))
    if (
        isinstance(value, tuple | list)
        and value
        and all(isinstance(v, torch.Tensor) for v in value)
    ):
        return OpaqueSpec(f"{type(value).__name__}[Tensor x{len(value)}]")
    return OpaqueSpec(type(value).__name__)
