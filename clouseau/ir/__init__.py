"""The shared IR of clouseau. Imports no framework (no torch, jax, onnx, safetensors)."""

from clouseau.ir.actions import Action, ActionKind, ArrayOps
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
    TraceKind,
)
from clouseau.ir.graph import (
    Frontend as Frontend,  # the old name of TraceKind, for code written before the rename
)
from clouseau.ir.interventions import Rewritten, insert_grad_saves, insert_interventions, rewrite
from clouseau.ir.passes import insert_saves, producer_of, strip_saves
from clouseau.ir.selection import Selector, select_points
from clouseau.ir.sink import SavedBatch, SavedValue, Saves, Sink
from clouseau.ir.verify import verify

__all__ = [
    "Action",
    "ActionKind",
    "ArrayOps",
    "CaptureError",
    "ClouseauError",
    "DType",
    "Graph",
    "MissingExtraError",
    "ModuleInfo",
    "Node",
    "NodeKind",
    "OpaqueSpec",
    "Point",
    "Ref",
    "Rewritten",
    "SavedBatch",
    "SavedValue",
    "Saves",
    "SelectionError",
    "Selector",
    "Sink",
    "Source",
    "Spec",
    "TensorSpec",
    "TraceError",
    "TraceKind",
    "VerificationError",
    "insert_grad_saves",
    "insert_interventions",
    "insert_saves",
    "producer_of",
    "rewrite",
    "select_points",
    "strip_saves",
    "verify",
]
