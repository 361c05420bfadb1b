"""Field types of a graph read from JSON: what the verifier takes for granted.

``Graph.from_json`` builds whatever the JSON holds (a list where a name belongs, a
negative size), and the verifier checks the graph's structure, not its field types. A
stored graph is read by ``show``, ``diff`` and ``draw``, so each field is checked here
before anything uses it.
"""

from __future__ import annotations

from clouseau.ir.graph import Graph, Node, OpaqueSpec, TensorSpec

_MAX_DEPTH = 64  # subgraphs nest (scan in scan); no real model comes near this


def check_types(graph: Graph, depth: int = 0) -> None:
    """ValueError naming the first field of ``graph`` that has the wrong type."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"subgraphs nested over {_MAX_DEPTH} deep")
    _text(graph.name, "the graph name")
    for module in graph.modules:
        _text(module.path, "a module path")
        _text(module.type, f"the type of module {module.path!r}")
        _count(module.params, f"the parameter count of module {module.path!r}")
    for key, value in graph.meta:
        _text(key, "a meta key")
        _attr(value, f"meta {key!r}")
    for node in graph.nodes:
        _node(node, depth)


def _node(node: Node, depth: int) -> None:
    _text(node.name, "a node name")
    where = f"node {node.name!r}"
    for field in ("op", "module", "module_type", "target", "key"):
        _text(getattr(node, field), f"the {field} of {where}")
    for ref in node.inputs:
        _text(ref.node, f"an input of {where}")
        _count(ref.index, f"an input index of {where}")
    for spec in node.outputs:
        if isinstance(spec, TensorSpec):
            for size in spec.shape:
                _count(size, f"a size in the shape of {where}")
        elif isinstance(spec, OpaqueSpec):
            _text(spec.type_name, f"an output type of {where}")
    if node.source is not None:
        source = node.source
        for value in (source.file, source.function, source.code):
            _text(value, f"the source of {where}")
        _count(source.line, f"the source line of {where}")
    for index, alias in node.aliases:
        _count(index, f"an alias index of {where}")
        _text(alias, f"an alias of {where}")
    for key, value in node.attrs:
        _text(key, f"an attribute name of {where}")
        _attr(value, f"attribute {key!r} of {where}")
    for sub in node.subgraphs:
        check_types(sub, depth + 1)


def _text(value: object, what: str) -> None:
    if type(value) is not str:
        raise ValueError(f"{what} is {_show(value)}, not a string")


def _count(value: object, what: str) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{what} is {_show(value)}, not a count (an int >= 0)")


def _attr(value: object, what: str, depth: int = 0) -> None:
    if isinstance(value, tuple) and depth < _MAX_DEPTH:
        for item in value:
            _attr(item, what, depth + 1)
    elif value is not None and type(value) not in (str, int, float, bool):
        raise ValueError(f"{what} is {_show(value)}, not a str, number, bool or None")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
