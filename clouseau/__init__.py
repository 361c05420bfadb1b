"""clouseau: a declarative graph-capture compiler for neural-network activations.

Trace a PyTorch, JAX or Equinox model into one IR, select points with a glob, and get a
drop-in model that writes those activations to safetensors::

    fmodel = clouseau.instrument(model, select="relu*", path=".clouseau")
    with fmodel:
        y = fmodel(x)
    cap = clouseau.load(".clouseau")
"""

from clouseau.api import backend, diff, draw, explore, export_onnx, instrument, trace
from clouseau.dataset import record
from clouseau.ir.actions import add, clamp, mean_ablate, noise, patch, replace, scale, zero
from clouseau.ir.errors import CaptureError, ClouseauError, SelectionError, TraceError
from clouseau.ir.graph import Graph, Point
from clouseau.ir.selection import Selector
from clouseau.store import Capture, load

__version__ = "0.2.0"

__all__ = [
    "Capture",
    "CaptureError",
    "ClouseauError",
    "Graph",
    "Point",
    "SelectionError",
    "Selector",
    "TraceError",
    "add",
    "backend",
    "clamp",
    "diff",
    "draw",
    "explore",
    "export_onnx",
    "instrument",
    "load",
    "mean_ablate",
    "noise",
    "patch",
    "record",
    "replace",
    "scale",
    "trace",
    "zero",
]

# Subpackages reachable as attributes after ``import clouseau`` (``clouseau.inspector.tail``),
# imported on first access so that ``import clouseau`` imports no framework.
_SUBMODULES = frozenset({"capture", "cli", "exporters", "inspector", "ir", "store"})


def __getattr__(name: str) -> object:
    if name in _SUBMODULES or name == "ray":
        import importlib

        # clouseau.ray is clouseau.distributed.ray: Ray Data, imported only when used.
        where = "distributed.ray" if name == "ray" else name
        return importlib.import_module(f"clouseau.{where}")
    raise AttributeError(f"module 'clouseau' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES, "ray"})
