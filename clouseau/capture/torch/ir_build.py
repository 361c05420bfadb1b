"""Trace a module (fx first, torch.export as the fallback) and build the verified IR graph."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch.export_trace import trace_export
from clouseau.capture.torch.fx_trace import trace_fx
from clouseau.capture.torch.naming import source_from_exception
from clouseau.capture.torch.probe import Probe, probe
from clouseau.capture.torch.traced import Traced
from clouseau.ir.errors import TraceError
from clouseau.ir.graph import Graph, ModuleInfo, Node, NodeKind, OpaqueSpec, Ref
from clouseau.ir.verify import verify


@dataclass(frozen=True, eq=False)
class TracedModel:
    """A traced model, the facts of its probe run, and its IR graph (without saves)."""

    traced: Traced
    probe: Probe
    graph: Graph


def trace_model(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TracedModel:
    """Trace ``model(*args, **kwargs)`` with torch.fx, or torch.export when fx fails.

    Raises
    ------
    TypeError
        ``model`` is not an ``nn.Module``.
    TraceError
        Neither tracer could trace the model; the message names both causes and the fix.
    """
    if not isinstance(model, torch.nn.Module):
        if callable(model):
            raise TypeError(
                f"clouseau's torch frontend traces an nn.Module, not a {type(model).__name__}: "
                "wrap the function in an nn.Module whose forward calls it"
            )
        raise TypeError(f"clouseau cannot trace a {type(model).__name__}: pass a torch.nn.Module")
    try:
        traced = trace_fx(model, args, kwargs)
        facts = probe(traced.gm, model, traced.to_inputs(args, kwargs))
    except Exception as fx_error:
        try:
            traced = trace_export(model, args, kwargs)
            traced = replace(traced, meta=(("fx_error", _first_line(fx_error)),))
            facts = probe(traced.gm, model, traced.to_inputs(args, kwargs))
        except Exception as export_error:
            raise TraceError(_both_failed(model, fx_error, export_error)) from export_error
    return TracedModel(traced, facts, build_graph(model, traced, facts))


def build_graph(model: torch.nn.Module, traced: Traced, facts: Probe) -> Graph:
    """The verified IR of ``traced``, with the specs observed by ``facts``."""
    nodes: list[Node] = []
    by_fx: dict[str, str] = {}
    taken: set[str] = set()
    for fx_node in traced.gm.graph.nodes:
        info = traced.infos.get(fx_node.name)
        if info is None:
            continue
        inputs = tuple(Ref(by_fx[a.name]) for a in _flat_inputs(fx_node) if a.name in by_fx)
        outputs = (
            ()
            if info.kind is NodeKind.OUTPUT
            else (facts.specs.get(fx_node.name, OpaqueSpec("None")),)
        )
        taken.add(info.name)
        nodes.append(
            Node(
                name=info.name, kind=info.kind, op=info.op, inputs=inputs, outputs=outputs,
                module=info.module, module_type=info.module_type, target=info.target,
                source=info.source, key=fx_node.name,
                aliases=tuple((0, a) for a in info.aliases),
            )
        )  # fmt: skip
        by_fx[fx_node.name] = info.name
    graph = Graph(
        nodes=_unique_aliases(nodes, taken),
        name=type(model).__name__,
        frontend=traced.frontend,
        modules=_modules(model),
        meta=(("training", model.training), *traced.meta),
    )
    return verify(graph)


def _flat_inputs(node: fx.Node) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


def _unique_aliases(nodes: list[Node], taken: set[str]) -> tuple[Node, ...]:
    # A module path that is also a node name (or a repeated alias) would make two points
    # with one name; the node name wins and the alias is dropped.
    out = []
    for node in nodes:
        kept = []
        for index, alias in node.aliases:
            if alias not in taken:
                taken.add(alias)
                kept.append((index, alias))
        out.append(replace(node, aliases=tuple(kept)) if len(kept) != len(node.aliases) else node)
    return tuple(out)


def _modules(model: torch.nn.Module) -> tuple[ModuleInfo, ...]:
    return tuple(
        ModuleInfo(path, type(m).__name__, sum(p.numel() for p in m.parameters()))
        for path, m in model.named_modules()
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {line}"


def _both_failed(
    model: torch.nn.Module, fx_error: BaseException, export_error: BaseException
) -> str:
    where = source_from_exception(fx_error) or source_from_exception(export_error)
    at = f" at {where.file}:{where.line} ({where.code})" if where else ""
    return (
        f"cannot trace {type(model).__name__}{at}.\n"
        f"  torch.fx failed: {_first_line(fx_error)}\n"
        f"  torch.export failed: {_first_line(export_error)}\n"
        "Fix: make the control flow on tensor values traceable (torch.where, or torch.cond "
        "for branches), or mark the offending submodule as a leaf with "
        "clouseau.capture.torch.mark_leaf(model.<path>) so it runs untraced as one node."
    )
