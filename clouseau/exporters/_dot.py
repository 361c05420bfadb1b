"""IR -> DOT text: nested module clusters, saved nodes highlighted, shape-labelled edges.

The layout is decided here, from the IR alone (no graphviz package): graphviz.py only
renders the text with the ``dot`` binary. Node ids are positional (``n12``), so the text
is stable for a given graph and golden tests can pin it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass

from clouseau.ir.graph import DType, Graph, Node, NodeKind, OpaqueSpec, Ref, Spec
from clouseau.ir.passes import producer_of
from clouseau.ir.selection import SelectLike, select_points

# Above this many drawn nodes, labels drop their module prefix (the cluster shows it).
COMPACT_ABOVE = 120

_COLORS = {
    "op": "#ffffff",
    "saved": "#ffd54f",
    "input": "#c8e6c9",
    "output": "#bbdefb",
    "module": "#e0e0e0",
    "constant": "#f5f5f5",
    "intervene": "#f8bbd0",
}
_CLUSTER_FILLS = ("#f7f9fc", "#eef3fa", "#e4ecf7", "#dae5f3")


@dataclass(frozen=True)
class DotOptions:
    """How to draw: see :func:`clouseau.exporters.graphviz.draw` for each field."""

    depth: int | None = None
    rollup: bool = False
    rankdir: str = "TB"
    constants: bool = False
    compact: bool | None = None  # None: compact when the graph is large
    title: str | None = None


@dataclass(frozen=True)
class _Group:
    """Sibling modules with the same type and body, drawn once (``layer1.* ×2``)."""

    members: tuple[str, ...]
    label: str


def graph_to_dot(
    graph: Graph, select: SelectLike = None, options: DotOptions = DotOptions()
) -> str:
    """The DOT text of ``graph``; nodes picked by ``select`` or saved are highlighted."""
    return _Builder(graph, select, options).build()


def container(node: Node) -> str:
    """The module a node is drawn in.

    A leaf-module call (``layer1.0.relu``, or ``layer1.0.relu_1`` for its second call) is
    one box in the module around it, not a cluster of its own.
    """
    module = node.module
    if module and (node.name == module or re.fullmatch(re.escape(module) + r"_\d+", node.name)):
        return module.rsplit(".", 1)[0] if "." in module else ""
    return module


def spec_label(spec: Spec) -> str:
    """``[2,64,8,8]`` for float32 (the common case), ``i64[2,3]`` otherwise."""
    if isinstance(spec, OpaqueSpec):
        return spec.type_name
    dims = "[" + ",".join(map(str, spec.shape)) + "]"
    return dims if spec.dtype is DType.FLOAT32 else spec.dtype.short + dims


class _Builder:
    def __init__(self, graph: Graph, select: SelectLike, options: DotOptions) -> None:
        self.graph = graph
        self.options = options
        self.index = {n.name: i for i, n in enumerate(graph.nodes)}
        self.drawn = tuple(n for n in graph.nodes if self._is_drawn(n))
        self.saved = _saved_names(graph, select)
        self.module_types = {m.path: m.type for m in graph.modules}
        for n in graph.nodes:
            if n.module and n.module_type:
                self.module_types.setdefault(n.module, n.module_type)
        self.known_modules = set(self.module_types) | {n.module for n in graph.nodes if n.module}
        # Where each drawn node lands: its own id, or the id of a collapsed module.
        self.place: dict[str, str] = {}
        self.collapsed: dict[str, list[Node]] = {}
        self.cluster_of: dict[str, str] = {}  # drawn id -> cluster path ("" = root)
        self._assign()
        self.groups = self._rollups() if options.rollup else ()
        self.hidden: set[str] = set()
        self.rename: dict[str, str] = {}  # drawn id -> representative id (rollup)
        self.shown_name: dict[str, str] = {}  # module path -> label when rolled up
        self._apply_rollups()
        n_drawn = len({self.place[n.name] for n in self.drawn} - self.hidden)
        self.compact = options.compact if options.compact is not None else n_drawn > COMPACT_ABOVE

    # -- which node goes where ---------------------------------------------------------
    def _is_drawn(self, node: Node) -> bool:
        if node.kind in (NodeKind.SAVE, NodeKind.SAVE_GRAD):
            return False
        return node.kind is not NodeKind.CONSTANT or self.options.constants

    def _modules_of(self, path: str) -> list[str]:
        """``path`` and its ancestors that are modules, outermost first."""
        parts = path.split(".") if path else []
        found = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return [p for p in found if p in self.known_modules or p == path]

    def _assign(self) -> None:
        depth = self.options.depth
        for node in self.drawn:
            home = container(node) if node.kind is NodeKind.OP else ""
            if node.kind is NodeKind.INTERVENE:  # beside the value it changes
                home = container(self.graph.node(producer_of(self.graph, node.inputs[0]).node))
            chain = self._modules_of(home)
            if depth is not None and len(chain) > depth:
                # Everything below the depth-th module collapses into its first child module.
                module = chain[depth]
                box = "m:" + module
                self.place[node.name] = box
                self.collapsed.setdefault(module, []).append(node)
                self.cluster_of[box] = chain[depth - 1] if depth > 0 else ""
            else:
                self.place[node.name] = f"n{self.index[node.name]}"
                self.cluster_of[self.place[node.name]] = chain[-1] if chain else ""

    # -- rollup of repeated blocks ------------------------------------------------------
    def _units(self) -> dict[str, list[Node]]:
        """Drawn nodes of every module path (itself and descendants), in execution order."""
        units: dict[str, list[Node]] = {}
        for node in self.drawn:
            if node.kind is not NodeKind.OP:
                continue
            for path in self._modules_of(container(node)):
                units.setdefault(path, []).append(node)
        return units

    def _rollups(self) -> tuple[_Group, ...]:
        units = self._units()
        by_parent: dict[str, list[str]] = {}
        for path in units:
            parent, _, last = path.rpartition(".")
            if last.isdigit():
                by_parent.setdefault(parent, []).append(path)
        groups: list[_Group] = []
        for parent, children in by_parent.items():
            run: list[str] = []
            for child in [*children, None]:
                if run and child is not None and self._same_block(run[0], child, units):
                    run.append(child)
                    continue
                if len(run) > 1:
                    groups.append(_Group(tuple(run), _group_label(parent, run, len(children))))
                run = [child] if child is not None else []
        return tuple(groups)

    def _same_block(self, a: str, b: str, units: dict[str, list[Node]]) -> bool:
        if self.module_types.get(a) != self.module_types.get(b):
            return False
        return _signature(a, units[a]) == _signature(b, units[b])

    def _apply_rollups(self) -> None:
        for group in self.groups:
            first = group.members[0]
            self.shown_name[first] = group.label
            rep = {n.name[len(first) + 1 :]: self.place[n.name] for n in self._nodes_in(first)}
            for member in group.members[1:]:
                for node in self._nodes_in(member):
                    own = self.place[node.name]
                    target = rep.get(node.name[len(member) + 1 :], own)
                    if own != target:
                        self.hidden.add(own)
                        self.rename[own] = target
                collapsed_id = "m:" + member
                if collapsed_id in self.cluster_of:
                    self.hidden.add(collapsed_id)
                    self.rename[collapsed_id] = "m:" + first

    def _nodes_in(self, path: str) -> list[Node]:
        prefix = path + "."
        return [n for n in self.drawn if n.name.startswith(prefix) or container(n) == path]

    def _member_of(self, node_name: str) -> tuple[int, int] | None:
        for g, group in enumerate(self.groups):
            for m, member in enumerate(group.members):
                if node_name.startswith(member + ".") or node_name == member:
                    return g, m
        return None

    # -- text ---------------------------------------------------------------------------
    def build(self) -> str:
        g, o = self.graph, self.options
        title = o.title if o.title is not None else f"{g.name or 'graph'} ({g.trace_kind.value})"
        lines = [
            f"digraph {_quote(g.name or 'graph')} {{",
            f"  graph [rankdir={o.rankdir}, fontname=Helvetica, fontsize=12, labelloc=t, "
            f"label={_quote(title)}, nodesep=0.25, ranksep=0.35, newrank=true];",
            '  node [fontname=Helvetica, fontsize=10, shape=box, style="rounded,filled", '
            f'fillcolor="{_COLORS["op"]}", color="#607d8b", margin="0.08,0.03", height=0.3];',
            '  edge [fontname=Helvetica, fontsize=8, color="#78909c", fontcolor="#455a64", arrowsize=0.6];',
        ]
        lines += self._cluster_lines()
        lines += self._edge_lines()
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _cluster_lines(self) -> list[str]:
        members: dict[str, list[str]] = {}
        for node_id, path in self.cluster_of.items():
            if node_id not in self.hidden:
                members.setdefault(path, []).append(node_id)
        paths = set()
        for path in members:
            paths.update(self._modules_of(path))
        children: dict[str, list[str]] = {}
        for path in sorted(paths, key=self._first_seen):
            chain = self._modules_of(path)
            parent = chain[-2] if len(chain) > 1 else ""
            children.setdefault(parent, []).append(path)
        hidden_modules = {m for grp in self.groups for m in grp.members[1:]}
        order = {self.place[n.name]: i for i, n in reversed(list(enumerate(self.drawn)))}
        for box in self.cluster_of:
            order.setdefault(box, len(order))

        def emit(path: str, level: int) -> list[str]:
            pad = "  " * (level + 1)
            out = [
                f"{pad}{self._node_line(i)}"
                for i in sorted(members.get(path, []), key=order.__getitem__)
            ]
            for child in children.get(path, []):
                if child in hidden_modules or any(
                    child.startswith(h + ".") for h in hidden_modules
                ):
                    continue
                fill = _CLUSTER_FILLS[min(level, len(_CLUSTER_FILLS) - 1)]
                label = self._cluster_label(child)
                out.append(f"{pad}subgraph {_quote('cluster_' + child)} {{")
                out.append(
                    f'{pad}  graph [label={label}, style="rounded,filled", fillcolor="{fill}", '
                    'color="#90a4ae", fontsize=10, labeljust=l];'
                )
                out += emit(child, level + 1)
                out.append(f"{pad}}}")
            return out

        return emit("", 0)

    def _first_seen(self, path: str) -> int:
        prefix = path + "."
        return next(
            (
                i
                for i, n in enumerate(self.drawn)
                if container(n) == path or container(n).startswith(prefix)
            ),
            len(self.drawn),
        )

    def _cluster_label(self, path: str) -> str:
        # Cluster labels keep the full path: in compact mode they are what locates a node.
        name = self.shown_name.get(path) or self._display(path, compact=False)
        kind = self.module_types.get(path)
        text = f"<B>{_esc(name)}</B>" + (f" ({_esc(kind)})" if kind else "")
        return f"<{text}>"

    def _node_line(self, node_id: str) -> str:
        if node_id.startswith("m:"):
            return self._module_box(node_id[2:])
        node = self.graph.nodes[int(node_id[1:])]
        name = self._display(node.name)
        attrs: dict[str, str] = {"tooltip": _quote(node.name)}
        if node.kind is NodeKind.INPUT:
            spec = ", ".join(spec_label(s) for s in node.outputs)
            attrs["label"] = (
                f'<<B>input</B> {_esc(name)}<BR/><FONT POINT-SIZE="8">{_esc(spec)}</FONT>>'
            )
            attrs |= {
                "shape": "invhouse",
                "style": '"filled"',
                "fillcolor": _quote(_COLORS["input"]),
            }
        elif node.kind is NodeKind.OUTPUT:
            attrs["label"] = "<<B>output</B>>"
            attrs |= {"shape": "house", "style": '"filled"', "fillcolor": _quote(_COLORS["output"])}
        elif node.kind is NodeKind.INTERVENE:
            action = str(node.attr("action", "intervene"))
            attrs["label"] = f'<<B>{_esc(action)}</B><BR/><FONT POINT-SIZE="8">intervention</FONT>>'
            attrs |= {
                "shape": "cds",
                "style": '"filled"',
                "fillcolor": _quote(_COLORS["intervene"]),
            }
        elif node.kind is NodeKind.CONSTANT:
            attrs["label"] = f"<{_esc(name)}>"
            attrs |= {"shape": "note", "fontsize": "8", "fillcolor": _quote(_COLORS["constant"])}
        else:
            sub = f" ({len(node.subgraphs)} subgraph)" if node.subgraphs else ""
            label = f'<B>{_esc(name)}</B><BR/><FONT POINT-SIZE="8" COLOR="#546e7a">{_esc(node.op + sub)}</FONT>'
            saved = self.saved.get(node.name)
            if saved is not None:
                others = [s for s in saved if s != node.name]
                note = "saved" + (
                    " as " + ", ".join(self._display(s) for s in others) if others else ""
                )
                label += f'<BR/><FONT POINT-SIZE="8" COLOR="#bf360c">{_esc(note)}</FONT>'
                attrs |= {
                    "fillcolor": _quote(_COLORS["saved"]),
                    "color": '"#e65100"',
                    "penwidth": "2",
                }
            attrs["label"] = f"<{label}>"
        return f"{node_id} [{', '.join(f'{k}={v}' for k, v in attrs.items())}];"

    def _module_box(self, path: str) -> str:
        nodes = self.collapsed[path]
        kind = self.module_types.get(path, "")
        name = self.shown_name.get(path, path)
        label = f"<B>{_esc(name)}</B>" + (
            f'<BR/><FONT POINT-SIZE="8">{_esc(kind)}</FONT>' if kind else ""
        )
        label += f'<BR/><FONT POINT-SIZE="7" COLOR="#546e7a">{len(nodes)} ops</FONT>'
        attrs = f'shape=box3d, style="filled", fillcolor="{_COLORS["module"]}"'
        saved = [s for n in nodes for s in self.saved.get(n.name, ())]
        if saved:
            label += f'<BR/><FONT POINT-SIZE="8" COLOR="#bf360c">saved: {len(saved)}</FONT>'
            attrs = f'shape=box3d, style="filled", fillcolor="{_COLORS["saved"]}", color="#e65100", penwidth=2'
        return f"{_quote('m:' + path)} [label=<{label}>, tooltip={_quote(path)}, {attrs}];"

    def _display(self, name: str, compact: bool | None = None) -> str:
        """A point name as drawn: rolled-up members show ``*``, compact mode drops the module."""
        for group in self.groups:
            first = group.members[0]
            if name.startswith(first + "."):
                name = group.label.split(" ")[0] + name[len(first) :]
                break
        if (self.compact if compact is None else compact) and "." in name:
            return name.rsplit(".", 1)[-1]
        return name

    def _edge_lines(self) -> list[str]:
        seen: set[tuple[str, str, str]] = set()
        out: list[str] = []
        for node in self.drawn:
            head = self._final(self.place[node.name])
            for ref in node.inputs:
                if ref.node not in self.place:  # a hidden constant
                    continue
                tail = self._final(self.place[ref.node])
                if tail == head or self._across_members(ref.node, node.name):
                    continue
                label = self._edge_label(ref)
                key = (tail, head, label)
                if key in seen:
                    continue
                seen.add(key)
                text = _quote(" " + label) if label else '""'
                out.append(f"  {_id(tail)} -> {_id(head)} [label={text}];")
        return out

    def _final(self, node_id: str) -> str:
        while node_id in self.rename:
            node_id = self.rename[node_id]
        return node_id

    def _across_members(self, tail: str, head: str) -> bool:
        a, b = self._member_of(tail), self._member_of(head)
        return a is not None and b is not None and a[0] == b[0] and a[1] != b[1]

    def _edge_label(self, ref: Ref) -> str:
        producer = self.graph.nodes[self.index[ref.node]]
        spec = producer.outputs[ref.index] if ref.index < len(producer.outputs) else None
        if spec is None or isinstance(spec, OpaqueSpec):
            return ""
        label = spec_label(spec)
        return label if len(producer.outputs) == 1 else f":{ref.index} {label}"


def _saved_names(graph: Graph, select: SelectLike) -> dict[str, tuple[str, ...]]:
    """Node name -> the point names saved (or selected) from it."""
    saved: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.kind is NodeKind.SAVE and node.inputs:
            names = node.attr("names", ())
            names = names if isinstance(names, tuple) else (names,)
            # An intervened value is saved after the intervention; mark its producer.
            producer = producer_of(graph, node.inputs[0]).node
            saved.setdefault(producer, []).extend(str(n) for n in names)
    if select is not None:
        for point in select_points(graph, select):
            saved.setdefault(point.ref.node, []).append(point.name)
    return {k: tuple(dict.fromkeys(v)) for k, v in saved.items()}


def _signature(path: str, nodes: Iterable[Node]) -> tuple[object, ...]:
    """What makes two blocks the same: ops, shapes and wiring, with names made relative."""
    prefix = path + "."
    inside = {n.name for n in nodes}
    sig: list[object] = []
    for n in nodes:
        inputs = tuple(
            (r.node[len(prefix) :] if r.node in inside else "<ext>", r.index) for r in n.inputs
        )
        sig.append((n.name[len(prefix) :], n.op, n.outputs, inputs))
    return tuple(sig)


def _group_label(parent: str, run: list[str], n_siblings: int) -> str:
    prefix = parent + "." if parent else ""
    if len(run) == n_siblings:
        return f"{prefix}* ×{len(run)}"
    first, last = run[0].rsplit(".", 1)[-1], run[-1].rsplit(".", 1)[-1]
    return f"{prefix}[{first}-{last}] ×{len(run)}"


_BARE_ID = re.compile(r"^n\d+$")


def _id(node_id: str) -> str:
    return node_id if _BARE_ID.match(node_id) else _quote(node_id)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


__all__ = ["DotOptions", "container", "graph_to_dot", "spec_label"]
