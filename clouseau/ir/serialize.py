"""JSON round-trip of the IR (stored in every capture directory as ``graph-NNN.json``)."""

from __future__ import annotations

from typing import Any

from clouseau.ir.errors import VerificationError
from clouseau.ir.graph import (
    AttrValue,
    DType,
    Graph,
    ModuleInfo,
    Node,
    NodeKind,
    OpaqueSpec,
    Ref,
    Source,
    Spec,
    TensorSpec,
    TraceKind,
)

#: The format marker of a graph file (store/layout.py recognises files by it).
GRAPH_FORMAT = "clouseau.graph"
FORMAT_VERSION = 1


def graph_to_json(graph: Graph) -> dict[str, Any]:
    return {
        "format": GRAPH_FORMAT,
        "version": FORMAT_VERSION,
        "name": graph.name,
        "frontend": graph.trace_kind.value,
        "modules": [[m.path, m.type, m.params] for m in graph.modules],
        "meta": [[k, _attr_out(v)] for k, v in graph.meta],
        "nodes": [_node_out(n) for n in graph.nodes],
    }


def graph_from_json(data: dict[str, Any]) -> Graph:
    if data.get("format") != GRAPH_FORMAT:
        raise VerificationError("not a clouseau graph: the 'format' field is missing or wrong")
    if data.get("version") != FORMAT_VERSION:
        raise VerificationError(
            f"graph format version {data.get('version')!r} is not supported (expected {FORMAT_VERSION})"
        )
    return Graph(
        nodes=tuple(_node_in(n) for n in data["nodes"]),
        name=data["name"],
        trace_kind=TraceKind(data["frontend"]),
        modules=tuple(ModuleInfo(p, t, int(c)) for p, t, c in data["modules"]),
        meta=tuple((k, _attr_in(v)) for k, v in data["meta"]),
    )


def _node_out(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": node.name,
        "kind": node.kind.value,
        "op": node.op,
        "inputs": [[r.node, r.index] for r in node.inputs],
        "outputs": [_spec_out(s) for s in node.outputs],
    }
    optional = {
        "module": node.module,
        "module_type": node.module_type,
        "target": node.target,
        "key": node.key,
        "source": None if node.source is None else list(_source_fields(node.source)),
        "aliases": [[i, a] for i, a in node.aliases],
        "attrs": [[k, _attr_out(v)] for k, v in node.attrs],
        "subgraphs": [graph_to_json(g) for g in node.subgraphs],
    }
    out.update({k: v for k, v in optional.items() if v})
    return out


def _node_in(data: dict[str, Any]) -> Node:
    source = data.get("source")
    return Node(
        name=data["name"],
        kind=NodeKind(data["kind"]),
        op=data["op"],
        inputs=tuple(Ref(n, int(i)) for n, i in data["inputs"]),
        outputs=tuple(_spec_in(s) for s in data["outputs"]),
        module=data.get("module", ""),
        module_type=data.get("module_type", ""),
        target=data.get("target", ""),
        key=data.get("key", ""),
        source=None if source is None else Source(*source),
        aliases=tuple((int(i), a) for i, a in data.get("aliases", ())),
        attrs=tuple((k, _attr_in(v)) for k, v in data.get("attrs", ())),
        subgraphs=tuple(graph_from_json(g) for g in data.get("subgraphs", ())),
    )


def _source_fields(source: Source) -> tuple[str, int, str, str]:
    return (source.file, source.line, source.function, source.code)


def _spec_out(spec: Spec) -> dict[str, Any]:
    if isinstance(spec, TensorSpec):
        out: dict[str, Any] = {"shape": list(spec.shape), "dtype": spec.dtype.value}
        if spec.dynamic:
            out["symbols"] = list(spec.symbols)
        return out
    return {"type": spec.type_name}


def _spec_in(data: dict[str, Any]) -> Spec:
    if "dtype" in data:
        symbols = tuple(str(s) for s in data.get("symbols", ()))
        return TensorSpec(tuple(int(d) for d in data["shape"]), DType(data["dtype"]), symbols)
    return OpaqueSpec(data["type"])


def _attr_out(value: AttrValue) -> Any:
    if isinstance(value, tuple):
        return {"t": [_attr_out(v) for v in value]}
    return value


def _attr_in(value: Any) -> AttrValue:
    if isinstance(value, dict):
        return tuple(_attr_in(v) for v in value["t"])
    return value
