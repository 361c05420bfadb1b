"""Point names, op names, sources and value specs shared by the fx and export paths.

Names follow torchvision's ``models.feature_extraction.get_graph_node_names``: a node is
``<module path>.<fx node name>`` (the module path alone for a leaf-module call), the fx
global ``_<n>`` suffix is removed and replaced by a counter local to the name.
"""

from __future__ import annotations

import inspect
import operator
import os
import re
import sysconfig
from types import FrameType
from typing import Any

import torch

from clouseau.capture._common import user_frame
from clouseau.capture.torch._compat import is_op_overload
from clouseau.ir.graph import DType, OpaqueSpec, Source, Spec, TensorSpec

_SUFFIX = re.compile(r"(.+)_([0-9]+)$")


class LocalNamer:
    """Unique names with torchvision's local ``_<n>`` counters.

    torchvision strips fx's global ``_<n>`` suffix from a name, then looks for the latest
    name already given that equals it or equals it plus ``_<n>``, and appends the next
    counter. ``last`` holds, for each possible base, the counter of the latest name that
    matches it, so each lookup is O(1) instead of torchvision's scan over all names.
    """

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.given: set[str] = set()

    def name(self, qualname: str) -> str:
        """The name for ``qualname`` (``<module path>.<fx node name>`` or a module path)."""
        match = _SUFFIX.match(qualname)
        base = match.group(1) if match else qualname
        found = self.last.get(base)
        name = base if found is None else f"{base}_{found + 1}"
        self.reserve(name)
        return name

    def reserve(self, name: str) -> None:
        """Record ``name`` as given (inputs and constants named outside the scheme)."""
        self.given.add(name)
        self.last[name] = 0
        match = _SUFFIX.match(name)
        if match:
            self.last[match.group(1)] = int(match.group(2))


def qualify(module_path: str, local: str) -> str:
    return f"{module_path}.{local}" if module_path else local


def is_leaf_class(cls: type) -> bool:
    """torch.fx's default leaf test: a torch.nn module other than ``nn.Sequential``."""
    module = cls.__module__ or ""
    builtin = module.startswith("torch.nn") or module.startswith("torch.ao.nn")
    return builtin and not issubclass(cls, torch.nn.Sequential)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# All of clouseau, not only capture/: a frame of clouseau/api.py is not the user's line.
_CLOUSEAU_DIR = (
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
)
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep


def is_user_file(filename: str) -> bool:
    """Whether a frame in ``filename`` belongs to the user (not torch, clouseau or stdlib)."""
    return not (
        filename.startswith((_TORCH_DIR, _CLOUSEAU_DIR, _STDLIB_DIR))
        or filename.startswith("<")  # fx-generated code, <string>, <frozen ...>
    )


def source_from_stack(frame: FrameType | None = None) -> Source | None:
    """The innermost user frame of the current stack: the model line that made a node."""
    frame = frame if frame is not None else inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return Source(code.co_filename, frame.f_lineno, code.co_name, _line(frame))
        frame = frame.f_back
    return None


def _line(frame: FrameType) -> str:
    import linecache

    return linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()


_TRACE_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n(?:\s+(.*))?')


def source_from_stack_trace(stack_trace: str | None) -> Source | None:
    """The innermost user frame of a formatted stack trace (torch.export's node meta)."""
    if not stack_trace:
        return None
    found = None
    for match in _TRACE_LINE.finditer(stack_trace):
        if is_user_file(match.group(1)):
            found = match
    if found is None:
        return None
    return Source(
        found.group(1), int(found.group(2)), found.group(3), (found.group(4) or "").strip()
    )


def source_from_exception(error: BaseException) -> Source | None:
    """The innermost user frame in the traceback of ``error``."""
    frame = user_frame(error, lambda file: not is_user_file(file))
    if frame is None or frame.lineno is None:
        return None
    return Source(frame.filename, frame.lineno, frame.name, (frame.line or "").strip())


def target_name(target: Any) -> str:
    """A printable qualified name of an fx call target: ``torch.flatten``, ``operator.add``."""
    if isinstance(target, str):
        return target
    if is_op_overload(target):
        return str(target)
    short = getattr(target, "__name__", "")
    for namespace, prefix in ((torch, "torch"), (torch.nn.functional, "torch.nn.functional")):
        if short and getattr(namespace, short, None) is target:
            return f"{prefix}.{short}"
    name = getattr(target, "__qualname__", None) or short or repr(target)
    module = getattr(target, "__module__", None)
    module = {"_operator": "operator"}.get(module, module)
    return f"{module}.{name}" if module else name


# Augmented assignment on a tensor (``x += y``) runs in place; its op is the plain op.
INPLACE_OPERATORS = {
    operator.iadd: "add", operator.isub: "sub", operator.imul: "mul",
    operator.itruediv: "truediv", operator.ifloordiv: "floordiv", operator.imod: "mod",
    operator.ipow: "pow", operator.imatmul: "matmul", operator.iand: "and_",
    operator.ior: "or_", operator.ixor: "xor", operator.ilshift: "lshift",
    operator.irshift: "rshift",
}  # fmt: skip


def function_op(target: Any) -> str:
    """The op of a call: ``add``, ``relu``, ``flatten``, ``getitem``; in-place ops as the op."""
    if isinstance(target, str):
        name = target
    elif target in INPLACE_OPERATORS:
        return INPLACE_OPERATORS[target]
    elif getattr(target, "overloadpacket", None) is not None:
        name = target.overloadpacket.__name__
    else:
        name = getattr(target, "__name__", None) or type(target).__name__
    # In-place methods and ATen ops (add_, relu_) are named after the op, as fx names "x += y".
    return name[:-1] if name.endswith("_") and not name.startswith("_") and len(name) > 1 else name


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
