"""Lower an instrumented IR graph back to a runnable ``torch.fx.GraphModule``.

The lowered module returns ``(outputs, saves)``: the model's outputs as the traced graph
returns them, and a tuple with one tensor per IR save node, in the order of
``graph.saves``. The same module exports to ONNX with the activations as outputs. A saved
value that a later op mutates in place is cloned at its save point (a snapshot); every
other saved value is returned as is (no copy on the device).

Interventions and gradient taps (:mod:`clouseau.capture.torch.lowering.intervene`) are fx
``call_function`` nodes right after the value they change or watch; with nothing to save,
change or watch, the traced GraphModule is returned unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch.lowering.computed import run_computed
from clouseau.capture.torch.lowering.computed_points import (
    drop_unread,
    lower_computed_points,
    lower_stand_ins,
)
from clouseau.capture.torch.lowering.intervene import grad_tap
from clouseau.capture.torch.tracing.export import LeafShapes
from clouseau.capture.torch.tracing.ir_build import TracedModel, trace_model
from clouseau.capture.torch.tracing.live import applier, live_plan
from clouseau.capture.torch.tracing.probe import FirstRun
from clouseau.ir.actions import Action
from clouseau.ir.computed_interventions import StandIn, grad_stand_ins, stand_ins
from clouseau.ir.graph import Graph, Node, NodeKind
from clouseau.ir.interventions import Grads, Rewritten, rewrite
from clouseau.ir.passes import producer_of
from clouseau.ir.selection import SelectLike

#: fx meta key of an intervention's node: the fx node name of the value it changes.
_CHANGES = "clouseau_changes"


@dataclass(frozen=True)
class SaveTarget:
    """What the host does with one saved tensor, decided once per signature.

    ``names`` and ``node`` label it in the capture (``node`` is the original producer,
    also through an intervention); ``host_copy`` says whether its host array must be a
    copy (its memory outlives the call: an input, a parameter, an output, or what an
    intervention returned).
    """

    names: tuple[str, ...]
    node: str
    host_copy: bool
    key: str = ""  # the producer's fx node name
    changed: bool = False  # the value an intervention returned, not the producer's
    computed: str = ""  # a computed point: the fx node of its value in the lowered module


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
    targets
        Per save: its names, its producer and whether its host array must be a copy.
    """

    module: fx.GraphModule
    graph: Graph
    saves: tuple[Node, ...]
    traced: TracedModel
    targets: tuple[SaveTarget, ...] = ()

    @property
    def host_copy(self) -> tuple[bool, ...]:
        return tuple(t.host_copy for t in self.targets)

    def inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The positional inputs of :attr:`module` for a call ``model(*args, **kwargs)``."""
        return self.traced.traced.to_inputs(args, kwargs)

    def outputs(self, raw: Any) -> Any:
        """The model's outputs from what :attr:`module` returned (saves dropped)."""
        out = raw[0] if self.saves else raw
        return self.traced.traced.from_outputs(out)

    def first_values(self, first: FirstRun) -> tuple[Any, ...]:
        """Every saved value of the first, probed call (computed points computed now)."""
        names = {t.computed for t in self.targets if t.computed}
        # A computed point reading an intervened value reads it as the call changed it.
        values = first.values | {
            n.name: first.value(n.meta[_CHANGES], changed=True)
            for n in self.module.graph.nodes
            if _CHANGES in n.meta
        }
        computed = run_computed(self.module, values, names) if names else {}
        return tuple(
            computed[t.computed] if t.computed else first.value(t.key, changed=t.changed)
            for t in self.targets
        )


def lower(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    select: SelectLike,
    *,
    intervene: Mapping[Any, Action] | None = None,
    grads: Grads = False,
    live: bool = False,
    shapes_seen: tuple[LeafShapes, ...] = (),
) -> Lowered:
    """Trace ``model``, rewrite the IR for ``select``, ``intervene`` and ``grads`` (strictly)
    and lower it to a GraphModule.

    With ``live`` the trace's probe is the user's call, applying ``intervene`` and
    ``grads`` as it runs: ``lowered.traced.first`` holds its output and values.
    ``shapes_seen``: the earlier shapes of this input structure; the export after a
    failed fx trace is dynamic in the dimensions that changed (static when empty).
    """
    changes = (
        partial(live_plan, select=select, intervene=intervene, grads=grads)
        if intervene or grads
        else None
    )
    traced = trace_model(model, args, kwargs, live=live, changes=changes, shapes_seen=shapes_seen)
    return lower_traced(traced, select, intervene=intervene, grads=grads)


def lower_traced(
    traced: TracedModel,
    select: SelectLike,
    *,
    intervene: Mapping[Any, Action] | None = None,
    grads: Grads = False,
    strict: bool = True,
) -> Lowered:
    """Rewrite a traced model's IR for ``select``, ``intervene`` and ``grads`` and lower it.

    ``strict=False``: a pattern that matches nothing here is no error (one region of
    several, in the dynamic tier).
    """
    rewritten = rewrite(
        traced.graph, select=select, intervene=intervene, grads=grads, strict=strict
    )
    graph = rewritten.graph
    found = stand_ins(graph) + grad_stand_ins(graph, "torch")
    module, computed = _rewrite(traced, rewritten, found)
    targets = tuple(
        SaveTarget(
            save.names,
            producer_of(graph, save.inputs[0]).node,
            _needs_host_copy(graph, traced, save),
            graph.node(producer_of(graph, save.inputs[0]).node).key,
            graph.node(save.inputs[0].node).kind is NodeKind.INTERVENE,
            computed.get(save.inputs[0].node, ""),
        )
        for save in graph.saves
    )
    return Lowered(module, graph, graph.saves, traced, targets)


def _needs_host_copy(graph: Graph, traced: TracedModel, save: Node) -> bool:
    if graph.node(save.inputs[0].node).kind is NodeKind.INTERVENE:
        return True  # replace(fn) may hand back any tensor
    key = graph.node(producer_of(graph, save.inputs[0]).node).key
    # A snapshot (a clone) is private; so is any value the run showed not to escape.
    return key in traced.probe.escapes and key not in traced.probe.mutated_later


def _rewrite(
    traced: TracedModel, rewritten: Rewritten, found: tuple[StandIn, ...]
) -> tuple[fx.GraphModule, dict[str, str]]:
    """The lowered module, and the fx node name of each computed point it computes."""
    graph = rewritten.graph
    base = traced.traced.gm
    if not (graph.saves or graph.interventions or graph.grad_saves):
        return base, {}  # nothing selected: the plain traced graph, no overhead
    fx_graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    outputs = fx_graph.graph_copy(base.graph, copies)
    fx_nodes = {old.name: new for old, new in copies.items()}
    # The fx node of every IR value: the traced nodes, then the intervene nodes added here.
    values = {node.name: fx_nodes[node.key] for node in graph.nodes if node.key in fx_nodes}
    computed = lower_computed_points(graph, fx_graph, values, fx_nodes)
    replaced: dict[fx.Node, fx.Node] = {}
    for node in graph.interventions:
        source = values[node.inputs[0].node]
        with fx_graph.inserting_after(_anchor(source)):
            new = fx_graph.call_function(applier(rewritten.action(node)), (source,))
        key = graph.node(producer_of(graph, node.inputs[0]).node).key
        if key:  # a model value (a computed point's first call is never probed live)
            new.meta[_CHANGES] = key
        # Every later reader (ops, in-place ops, the output) computes on the new value.
        source.replace_all_uses_with(new, delete_user_cb=lambda user, new=new: user is not new)
        replaced[source] = new
        values[node.name] = new
    drops = lower_stand_ins(graph, found, fx_graph, values, fx_nodes)
    for node in graph.grad_saves:
        value = values[node.inputs[0].node]
        with fx_graph.inserting_after(_anchor(value)):
            fx_graph.call_function(
                grad_tap(node, producer_of(graph, node.inputs[0]).node), (value,)
            )
    saved: list[fx.Node] = []
    snapshots: dict[fx.Node, fx.Node] = {}
    for save in graph.saves:
        value = values[save.inputs[0].node]
        if graph.node(producer_of(graph, save.inputs[0]).node).key in traced.probe.mutated_later:
            # A later in-place op changes this value: copy it right where it is produced.
            if value not in snapshots:
                with fx_graph.inserting_after(_anchor(value)):
                    snapshots[value] = fx_graph.call_function(torch.clone, (value,))
            value = snapshots[value]
        saved.append(value)
    outputs = fx.node.map_arg(outputs, lambda n: replaced.get(n, n))
    fx_graph.output((outputs, tuple(saved)) if graph.saves else outputs)
    drop_unread(fx_graph, drops)  # after the saves: a saved value is read
    module = fx.GraphModule(base, fx_graph, class_name=type(base).__name__)
    return module, {name: node.name for name, node in computed.items()}


def _anchor(node: fx.Node) -> fx.Node:
    """Where code reading ``node`` goes: right after it, or after the last placeholder."""
    if node.op != "placeholder":
        return node
    return [n for n in node.graph.nodes if n.op == "placeholder"][-1]
