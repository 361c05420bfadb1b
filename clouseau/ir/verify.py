"""The one verifier of the IR. Tests run it after every pass; frontends after every trace.

It checks what every consumer of a graph relies on: unique names, references to values
defined earlier, one output node at the end, save and intervene nodes that read a tensor
(an intervene node keeping its spec), and the same for every subgraph.
"""

from __future__ import annotations

from dataclasses import dataclass

from clouseau.ir.errors import VerificationError
from clouseau.ir.graph import INSTRUMENTATION, Graph, Node, NodeKind, TensorSpec
from clouseau.ir.printer import format_node

_FORBIDDEN_IN_NAMES = frozenset(" \t\n#%,")


def verify(graph: Graph) -> Graph:
    """Check the invariants of ``graph``; return it unchanged or raise VerificationError."""
    defined: dict[str, Node] = {}
    point_names: set[str] = set()
    for position, node in enumerate(graph.nodes):
        where = _Where(graph, position, node)
        _check_name(node.name, where)
        if node.name in defined:
            raise VerificationError(f"{where}: the name {node.name!r} is used by two nodes")
        for ref in node.inputs:
            producer = defined.get(ref.node)
            if producer is None:
                raise VerificationError(f"{where}: reads {ref}, which is not defined before it")
            if not 0 <= ref.index < len(producer.outputs):
                raise VerificationError(
                    f"{where}: reads {ref}, but {ref.node!r} has {len(producer.outputs)} output(s)"
                )
        _check_kind(graph, position, node, defined, where)
        for index, alias in node.aliases:
            _check_name(alias, where)
            if not 0 <= index < len(node.outputs):
                raise VerificationError(
                    f"{where}: alias {alias!r} names output {index}, which does not exist"
                )
        if node.kind not in INSTRUMENTATION and node.kind is not NodeKind.OUTPUT:
            names = [node.output_name(i) for i in range(len(node.outputs))] + [
                a for _, a in node.aliases
            ]
            for name in names:
                if name in point_names:
                    raise VerificationError(f"{where}: the point name {name!r} is used twice")
                point_names.add(name)
        for sub in node.subgraphs:
            try:
                verify(sub)
            except VerificationError as err:
                raise VerificationError(f"{where}: in its subgraph: {err}") from None
        defined[node.name] = node
    return graph


def _check_kind(
    graph: Graph, position: int, node: Node, defined: dict[str, Node], where: _Where
) -> None:
    if node.kind is NodeKind.OUTPUT:
        if position != len(graph.nodes) - 1:
            raise VerificationError(f"{where}: the output node must be the last node")
    elif position == len(graph.nodes) - 1:
        raise VerificationError(f"{where}: the graph must end with an output node")
    if node.kind in (NodeKind.SAVE, NodeKind.SAVE_GRAD):
        if len(node.inputs) != 1 or node.outputs:
            raise VerificationError(f"{where}: a save node reads one value and produces none")
        _check_reads_tensor(node, defined, where)
        _check_names(node, where)
    if node.kind is NodeKind.INTERVENE:
        if len(node.inputs) != 1:
            raise VerificationError(f"{where}: an intervene node reads one value")
        spec = _check_reads_tensor(node, defined, where)
        # Consumers were typed against the original value: the action must keep its spec.
        if node.outputs != (spec,):
            raise VerificationError(
                f"{where}: an intervene node produces one value of its input's spec ({spec})"
            )
        if not isinstance(node.attr("action"), str):
            raise VerificationError(f"{where}: an intervene node needs an 'action' attribute")
        _check_names(node, where)
    if node.kind is NodeKind.INPUT and node.inputs:
        raise VerificationError(f"{where}: an input node reads no value")


def _check_reads_tensor(node: Node, defined: dict[str, Node], where: _Where) -> TensorSpec:
    ref = node.inputs[0]
    spec = defined[ref.node].outputs[ref.index]
    if not isinstance(spec, TensorSpec):
        raise VerificationError(f"{where}: reads {ref}, which is not a tensor")
    return spec


def _check_names(node: Node, where: _Where) -> None:
    names = node.attr("names")
    if not isinstance(names, tuple) or not names:
        raise VerificationError(
            f"{where}: a {node.kind.value} node needs a non-empty 'names' attribute"
        )


def _check_name(name: str, where: _Where) -> None:
    if not name or any(c in _FORBIDDEN_IN_NAMES for c in name):
        raise VerificationError(
            f"{where}: {name!r} is not a valid name (empty, or contains whitespace, '#', '%' or ',')"
        )


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a node is, for an error message: formatted only when one is raised.

    Printing a node costs more than checking it, and a graph that passes (nearly every
    one) never needs the text; verify runs after every trace and pass.
    """

    graph: Graph
    position: int
    node: Node

    def __str__(self) -> str:
        node = format_node(self.node, sources=False)
        return f"graph {self.graph.name!r}, node #{self.position} ({node})"
