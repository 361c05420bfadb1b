"""clouseau: a declarative graph-capture compiler for neural-network activations.

Trace a PyTorch, JAX or Equinox model into one IR, select points with a glob, and get a
drop-in model that writes those activations to safetensors::

    fmodel = clouseau.instrument(model, select="relu*", path=".clouseau")
    with fmodel:
        y = fmodel(x)
    cap = clouseau.load(".clouseau")
"""

from clouseau.api import diff, draw, export_onnx, instrument, trace
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
    "clamp",
    "diff",
    "draw",
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
