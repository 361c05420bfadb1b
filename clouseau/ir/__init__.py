"""The shared IR of clouseau. Imports no framework (no torch, jax, onnx, safetensors)."""

from clouseau.ir.errors import (
    CaptureError,
    ClouseauError,
    MissingExtraError,
    SelectionError,
    TraceError,
    VerificationError,
)
from clouseau.ir.graph import (
    DType,
    Frontend,
    Graph,
    ModuleInfo,
    Node,
    NodeKind,
    OpaqueSpec,
    Point,
    Ref,
    Source,
    Spec,
    TensorSpec,
)
from clouseau.ir.passes import insert_saves, strip_saves
from clouseau.ir.selection import Selector, select_points
from clouseau.ir.sink import SavedValue, Sink
from clouseau.ir.verify import verify

__all__ = [
    "CaptureError",
    "ClouseauError",
    "DType",
    "Frontend",
    "Graph",
    "MissingExtraError",
    "ModuleInfo",
    "Node",
    "NodeKind",
    "OpaqueSpec",
    "Point",
    "Ref",
    "SavedValue",
    "SelectionError",
    "Selector",
    "Sink",
    "Source",
    "Spec",
    "TensorSpec",
    "TraceError",
    "VerificationError",
    "insert_saves",
    "select_points",
    "strip_saves",
    "verify",
]
