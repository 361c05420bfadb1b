"""The stable textual form of a graph: one node per line, pinned by golden tests.

::

    graph Net (torch.fx) {
      %x : f32[2,8] = input()
      %fc1 : f32[2,16] = linear(%x)  @fc1 (Linear)  # model.py:12
      save %fc1 as fc1
      return %fc1
    }

Rewrite passes add ``save``, ``save_grad %fc1 as fc1.grad`` and intervene lines such as
``%intervene.fc1 : f32[2,16] = intervene[scale(0.5)](%fc1)``.
"""

from __future__ import annotations

from clouseau.ir.graph import AttrValue, Graph, Node, NodeKind


def format_graph(graph: Graph, *, indent: str = "", sources: bool = True) -> str:
    head = f"{indent}graph {graph.name or '<anonymous>'} ({graph.trace_kind.value}) {{"
    lines = [head]
    for node in graph.nodes:
        lines.append(f"{indent}  {format_node(node, sources=sources)}")
        for sub in node.subgraphs:
            lines.append(format_graph(sub, indent=indent + "    ", sources=sources))
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def format_node(node: Node, *, sources: bool = True) -> str:
    args = ", ".join(map(str, node.inputs))
    if node.kind is NodeKind.SAVE:
        return f"save {args} as {', '.join(_str_tuple(node.attr('names')))}"
    if node.kind is NodeKind.SAVE_GRAD:
        return f"save_grad {args} as {', '.join(_str_tuple(node.attr('names')))}"
    if node.kind is NodeKind.INTERVENE:
        # The action reads as the op, so the line says what downstream sees instead.
        outs = ", ".join(map(str, node.outputs))
        return f"%{node.name} : {outs} = intervene[{node.attr('action')}]({args})"
    if node.kind is NodeKind.OUTPUT:
        return f"return {args}"
    outs = ", ".join(map(str, node.outputs))
    text = f"%{node.name} : {outs} = {node.op}({args})"
    shown_attrs = [(k, v) for k, v in node.attrs if not k.startswith("_")]
    if shown_attrs:
        text += " {" + ", ".join(f"{k}={_format_attr(v)}" for k, v in shown_attrs) + "}"
    if node.module:
        text += (
            f"  @{node.module} ({node.module_type})" if node.module_type else f"  @{node.module}"
        )
    if node.aliases:
        text += "  aka " + ", ".join(a if i == 0 else f"{a}<-:{i}" for i, a in node.aliases)
    if sources and node.source is not None:
        text += f"  # {node.source}"
    return text


def _format_attr(value: AttrValue) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_format_attr(v) for v in value) + ")"
    if isinstance(value, float):
        return repr(value)
    return str(value) if not isinstance(value, str) else value


def _str_tuple(value: AttrValue) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, tuple) else (str(value),)
