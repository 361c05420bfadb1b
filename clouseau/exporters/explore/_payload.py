"""IR graph (+ statistics, + diff) -> the JSON document the page reads.

Nodes are numbered in execution order and refer to each other (edges) and to their group
(the module they are drawn in) by index, which keeps a 50,000-node document compact.
Groups form the module tree; a module with very many operations of its own is split into
synthetic chunks of consecutive operations, so that every group the page opens stays
small enough to lay out.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from clouseau.exporters._dot import spec_label
from clouseau.exporters.explore._stats import CallStats, PointError, call_stats, json_safe
from clouseau.ir.flops import node_flops
from clouseau.ir.graph import INSTRUMENTATION, Graph, Node, NodeKind, Ref, TensorSpec

# The page opens with modules expanded down to the deepest level that shows at most this
# many boxes; deeper modules start collapsed (and the page says so).
OPEN_BUDGET = 100
# A group with more direct operations than this is split into chunks of consecutive ones.
CHUNK = 200


@dataclass
class _Group:
    path: str
    type: str
    parent: int
    depth: int
    params: int = 0
    synthetic: bool = False
    nodes: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ExploreInput:
    """What the page shows: a graph and, optionally, saved values' statistics and diff rows.

    ``stats`` maps a point name to the :class:`CallStats` of its calls (computed one array
    at a time by the caller, so that a capture is never held whole); ``arrays`` maps a
    point name to ``(call, array)`` pairs already in memory; ``errors`` are the rows of a
    diff, by point name in the first capture; ``first`` names its first divergence.
    """

    graph: Graph
    title: str = ""
    arrays: Mapping[str, Sequence[tuple[int, np.ndarray]]] = field(default_factory=dict)
    errors: Sequence[PointError] = ()
    first: str = ""
    diff_summary: str = ""
    depth: int | None = None
    stats: Mapping[str, Sequence[CallStats]] = field(default_factory=dict)


def build_payload(data: ExploreInput) -> dict[str, object]:
    """The JSON-ready document of ``data`` (non-finite numbers already spelled as strings)."""
    graph = data.graph
    shown = [n for n in graph.nodes if _is_shown(n)]
    index = {n.name: i for i, n in enumerate(shown)}
    by_name = {n.name: n for n in graph.nodes}
    groups, node_group = _groups(graph, shown)
    saved = _saved_nodes(graph, by_name, index)
    params = {m.path: m.params for m in graph.modules}
    nodes = [_node_json(graph, n, node_group[i], index, by_name, i in saved, params)
             for i, n in enumerate(shown)]  # fmt: skip
    points = [[p.name, index[_resolve(by_name, p.ref).node], int(p.is_alias)]
              for p in graph.points if _resolve(by_name, p.ref).node in index]  # fmt: skip
    point_node = {name: i for name, i, _ in points}
    depth = data.depth if data.depth is not None else _open_depth(groups)
    payload: dict[str, object] = {
        "title": data.title or graph.name or "graph",
        "frontend": graph.trace_kind.value,
        "nodes": nodes,
        "groups": [_group_json(g) for g in groups],
        "points": points,
        "depth": depth,
        "note": _note(len(shown), groups, depth),
        "stats": _stats_json(data, point_node),
        "diff": _diff_json(data, point_node, shown, index, by_name),
    }
    return payload


def _is_shown(node: Node) -> bool:
    # Parameters and what rewrite passes added are not drawn: saves mark their input.
    return node.kind not in INSTRUMENTATION and node.kind is not NodeKind.CONSTANT


def _resolve(by_name: dict[str, Node], ref: Ref) -> Ref:
    """The drawn producer behind ``ref`` (through intervene nodes)."""
    node = by_name[ref.node]
    while node.kind in INSTRUMENTATION and node.inputs:
        ref = node.inputs[0]
        node = by_name[ref.node]
    return ref


def _saved_nodes(graph: Graph, by_name: dict[str, Node], index: dict[str, int]) -> set[int]:
    found = set()
    for save in graph.saves:
        if save.inputs:
            ref = _resolve(by_name, save.inputs[0])
            if ref.node in index:
                found.add(index[ref.node])
    return found


def _node_json(graph: Graph, node: Node, group: int, index: dict[str, int],
               by_name: dict[str, Node], saved: bool, params: dict[str, int]) -> dict[str, object]:  # fmt: skip
    inputs = []
    for ref in node.inputs:
        src = _resolve(by_name, ref)
        if src.node in index:
            spec = by_name[src.node].outputs[src.index] if by_name[src.node].outputs else None
            inputs.append([index[src.node], spec_label(spec) if spec is not None else ""])
    tensor = next((s for s in node.outputs if isinstance(s, TensorSpec)), None)
    item: dict[str, object] = {
        "n": node.name,
        "o": node.op,
        "k": node.kind.value,
        "g": group,
        "s": ", ".join(spec_label(s) for s in node.outputs),
        "in": inputs,
    }
    if tensor is not None:
        item["dt"] = tensor.dtype.value
    if node.module:
        item["m"], item["mt"] = node.module, node.module_type
    if node.source is not None:
        item["src"] = f"{node.source.file}:{node.source.line}"
        if node.source.code:
            item["code"] = node.source.code
    flops = node_flops(graph, node)
    if flops is not None:
        item["fl"] = flops
    if params.get(node.module):  # the parameters of the module the node belongs to
        item["pa"] = params[node.module]
    if node.aliases:
        item["al"] = [a for _, a in node.aliases]
    if saved:
        item["sv"] = 1
    return item


def _groups(graph: Graph, shown: list[Node]) -> tuple[list[_Group], list[int]]:
    types = {m.path: (m.type, m.params) for m in graph.modules}
    for n in graph.nodes:
        if n.module and n.module_type and n.module not in types:
            types[n.module] = (n.module_type, 0)
    groups = [_Group("", types.get("", (graph.name or "model", 0))[0], -1, 0)]
    groups[0].params = types.get("", ("", 0))[1]
    by_path = {"": 0}

    def group_of(path: str) -> int:
        if path in by_path:
            return by_path[path]
        parent = group_of(path.rsplit(".", 1)[0] if "." in path else "")
        kind, params = types.get(path, ("", 0))
        groups.append(_Group(path, kind, parent, groups[parent].depth + 1, params))
        by_path[path] = len(groups) - 1
        return by_path[path]

    node_group = []
    for i, node in enumerate(shown):
        g = group_of(_container(node))
        groups[g].nodes.append(i)
        node_group.append(g)
    for g in range(len(groups)):
        if len(groups[g].nodes) > CHUNK:
            _chunk(groups, g, node_group)
    return groups, node_group


def _container(node: Node) -> str:
    """The module a node is drawn in, as ``_dot.container`` decides (without a regex each).

    A leaf-module call (``layer1.0.relu``, or ``layer1.0.relu_1`` for its second call) is
    one box in the module around it.
    """
    module, name = node.module, node.name
    if module and (
        name == module or (name.startswith(module + "_") and name[len(module) + 1 :].isdigit())
    ):
        return module.rsplit(".", 1)[0] if "." in module else ""
    return module


def _chunk(groups: list[_Group], g: int, node_group: list[int]) -> None:
    """Move the direct operations of group ``g`` into synthetic groups of consecutive ones."""
    members = groups[g].nodes
    size = max(CHUNK, math.ceil(len(members) / CHUNK))
    for start in range(0, len(members), size):
        part = members[start : start + size]
        label = f"ops {start}–{start + len(part) - 1}"
        path = f"{groups[g].path}[{label}]" if groups[g].path else f"[{label}]"
        groups.append(_Group(path, label, g, groups[g].depth + 1, synthetic=True, nodes=part))
        for i in part:
            node_group[i] = len(groups) - 1
    groups[g].nodes = []


def _group_json(g: _Group) -> dict[str, object]:
    item: dict[str, object] = {"p": g.path, "t": g.type, "up": g.parent, "d": g.depth}
    if g.params:
        item["pa"] = g.params
    if g.synthetic:
        item["syn"] = 1
    return item


def _open_depth(groups: list[_Group]) -> int:
    """The deepest level whose expansion shows at most OPEN_BUDGET boxes (at least 0)."""
    deepest = max(g.depth for g in groups)
    best = 0
    for depth in range(deepest + 1):
        boxes = sum(len(g.nodes) for g in groups if g.depth <= depth)
        boxes += sum(1 for g in groups if g.depth == depth + 1)
        if boxes > OPEN_BUDGET:
            break
        best = depth
    return best


def _note(count: int, groups: list[_Group], depth: int) -> str:
    if all(g.depth <= depth for g in groups):
        return ""
    return (
        f"{count:,} nodes: modules deeper than level {depth} start collapsed so the page opens "
        "fast. Double-click a group (or select it and press Enter) to expand it; search "
        "expands the groups holding its matches."
    )


def _stats_json(data: ExploreInput, point_node: dict[str, int]) -> dict[str, object]:
    out: dict[str, dict[str, object]] = {}
    names = {**dict.fromkeys(data.arrays), **dict.fromkeys(data.stats)}
    for name in names:
        node = point_node.get(name)
        if node is None:
            continue
        entry = out.setdefault(str(node), {"names": [], "calls": []})
        entry["names"].append(name)  # type: ignore[attr-defined]
        if not entry["calls"]:  # several names of one value: one set of statistics
            found = data.stats.get(name)
            if found is None:
                found = [call_stats(c, a) for c, a in data.arrays[name]]
            entry["calls"] = [s.to_json() for s in found]
    return json_safe(out)  # type: ignore[return-value]


def _diff_json(data: ExploreInput, point_node: dict[str, int], shown: list[Node],
               index: dict[str, int], by_name: dict[str, Node]) -> dict[str, object] | None:  # fmt: skip
    if not data.errors and not data.diff_summary:
        return None
    rows: dict[str, list[object]] = {}
    for row in data.errors:
        node = point_node.get(row.name)
        if node is not None:
            rows.setdefault(str(node), []).append(row.to_json())
    first = point_node.get(data.first, -1)
    path = _path_to(first, shown, index, by_name) if first >= 0 else []
    return json_safe(
        {
            "rows": rows,
            "first": first,
            "firstName": data.first,
            "path": path,
            "summary": data.diff_summary,
        }
    )  # type: ignore[return-value]


def _path_to(target: int, shown: list[Node], index: dict[str, int],
             by_name: dict[str, Node]) -> list[int]:  # fmt: skip
    """The shortest chain of producers from a graph input to node ``target``."""
    successor = {target: -1}  # node -> the node one step closer to target
    queue = deque([target])
    while queue:
        i = queue.popleft()
        if shown[i].kind is NodeKind.INPUT:
            return _unwind(successor, i, target)
        for ref in shown[i].inputs:
            src = index.get(_resolve(by_name, ref).node)
            if src is not None and src not in successor:
                successor[src] = i
                queue.append(src)
    return [target]


def _unwind(successor: dict[int, int], start: int, target: int) -> list[int]:
    chain = [start]
    while chain[-1] != target:
        chain.append(successor[chain[-1]])
    return chain
