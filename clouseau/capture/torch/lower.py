"""Lower an instrumented IR graph back to a runnable ``torch.fx.GraphModule``.

The lowered module returns ``(outputs, saves)``: the model's outputs as the traced graph
returns them, and a tuple with one tensor per IR save node, in the order of
``graph.saves``. The same module exports to ONNX with the activations as outputs. A saved
value that a later op mutates in place is cloned at its save point (a snapshot); every
other saved value is returned as is (no copy on the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch.ir_build import TracedModel, trace_model
from clouseau.ir.graph import Graph, Node
from clouseau.ir.passes import insert_saves
from clouseau.ir.selection import SelectLike


@dataclass(frozen=True, eq=False)
class Lowered:
    """An instrumented model for one input signature.

    Attributes
    ----------
    module
        The GraphModule; ``module(*inputs)`` returns ``(outputs, saves)`` when ``saves``
        is non-empty, and the traced outputs alone when nothing is saved.
    graph
        The IR with its save nodes.
    saves
        The IR save nodes, in the order of the tensors the module returns.
    traced
        The traced model (its calling-convention adapters, probe facts, plain graph).
    """

    module: fx.GraphModule
    graph: Graph
    saves: tuple[Node, ...]
    traced: TracedModel

    def inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The positional inputs of :attr:`module` for a call ``model(*args, **kwargs)``."""
        return self.traced.traced.to_inputs(args, kwargs)

    def outputs(self, raw: Any) -> Any:
        """The model's outputs from what :attr:`module` returned (saves dropped)."""
        out = raw[0] if self.saves else raw
        return self.traced.traced.from_outputs(out)


def lower(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], select: SelectLike
) -> Lowered:
    """Trace ``model``, insert saves for ``select`` (strictly) and lower to a GraphModule."""
    traced = trace_model(model, args, kwargs)
    graph = insert_saves(traced.graph, select)
    return Lowered(_rewrite(traced, graph), graph, graph.saves, traced)


def _rewrite(traced: TracedModel, graph: Graph) -> fx.GraphModule:
    base = traced.traced.gm
    saves = graph.saves
    if not saves:
        return base  # nothing selected: the plain traced graph, no overhead
    fx_graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    outputs = fx_graph.graph_copy(base.graph, copies)
    fx_nodes = {old.name: new for old, new in copies.items()}
    producers = {node.name: node for node in graph.nodes}
    saved: list[fx.Node] = []
    snapshots: dict[str, fx.Node] = {}
    for save in saves:
        key = producers[save.inputs[0].node].key
        value = fx_nodes[key]
        if key in traced.probe.mutated_later:
            # A later in-place op changes this value: copy it right where it is produced.
            if key not in snapshots:
                with fx_graph.inserting_after(value):
                    snapshots[key] = fx_graph.call_function(torch.clone, (value,))
            value = snapshots[key]
        saved.append(value)
    fx_graph.output((outputs, tuple(saved)))
    return fx.GraphModule(base, fx_graph, class_name=type(base).__name__)
