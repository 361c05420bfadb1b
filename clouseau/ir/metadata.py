"""Per-node metadata computed from the IR: FLOPs, parameters, one record per point.

Every node already holds its output specs (shape, dtype), module path and type and source
line; this module adds what is derived from them: the parameter count of the node's
module (from ``Graph.modules``) and an estimate of its floating-point operations (the
rules are in :mod:`clouseau.ir.flops`, keyed on the op category each frontend sets). The
pandas frames and the rich summary built from these records are in :mod:`clouseau.ir.tables`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clouseau.ir.flops import input_specs, loop_factor, node_flops, total_flops
from clouseau.ir.graph import Graph, Node, TensorSpec

__all__ = [
    "NodeMetadata",
    "input_specs",
    "loop_factor",
    "module_params",
    "node_flops",
    "node_metadata",
    "point_rows",
    "total_flops",
]


def module_params(graph: Graph, node: Node) -> int:
    """The parameters of the module ``node`` belongs to (0 at the root or outside modules)."""
    if not node.module:
        return 0
    info = graph.module(node.module)
    return info.params if info is not None else 0


@dataclass(frozen=True)
class NodeMetadata:
    """Everything clouseau knows about one node, as one record."""

    name: str
    kind: str
    op: str
    shapes: tuple[tuple[int, ...] | None, ...]
    dtypes: tuple[str | None, ...]
    module: str
    module_type: str
    module_params: int
    flops: int | None
    source: str | None


def node_metadata(graph: Graph, node: Node) -> NodeMetadata:
    """The :class:`NodeMetadata` of ``node`` in ``graph``."""
    return NodeMetadata(
        name=node.name,
        kind=node.kind.value,
        op=node.op,
        shapes=tuple(s.shape if isinstance(s, TensorSpec) else None for s in node.outputs),
        dtypes=tuple(s.dtype.value if isinstance(s, TensorSpec) else None for s in node.outputs),
        module=node.module,
        module_type=node.module_type,
        module_params=module_params(graph, node),
        flops=node_flops(graph, node),
        source=None if node.source is None else f"{node.source.file}:{node.source.line}",
    )


def point_rows(graph: Graph) -> dict[str, dict[str, Any]]:
    """The metadata of every point name (node names and aliases), one plain dict each.

    The rows of :func:`clouseau.ir.tables.points_frame`; keys as its columns.
    """
    intervened = {n.inputs[0]: str(n.attr("action")) for n in graph.interventions}
    saved = {name for s in graph.saves for name in s.names}
    grads = {name for s in graph.grad_saves for name in s.names}
    factors = loop_factor(graph)
    rows: dict[str, dict[str, Any]] = {}
    for point in graph.points:
        node, spec = point.node, point.spec
        flops = node_flops(graph, node)
        rows[point.name] = {
            "name": point.name,
            "node": node.name,
            "op": node.op,
            "alias": point.is_alias,
            "shape": spec.shape,
            "dtype": spec.dtype.value,
            "nbytes": spec.nbytes,
            "module": node.module,
            "module_type": node.module_type,
            "module_params": module_params(graph, node),
            "flops": None if flops is None else flops * factors.get(node.name, 1),
            "source": None if node.source is None else f"{node.source.file}:{node.source.line}",
            "intervention": intervened.get(point.ref),
            "saved": point.name in saved,
            "grad_saved": point.name + ".grad" in grads,
        }
    return rows
