"""Tables of graphs and captures: pandas frames and the rich summary.

The records come from the IR (:func:`clouseau.ir.metadata.point_rows`, the FLOP rules of
:mod:`clouseau.ir.flops`); this module only lays them out. pandas and rich are optional
extras, imported inside the functions that draw with them, so importing the IR imports
neither. ``Graph.to_pandas``, ``Graph.summary`` and ``Capture.to_pandas`` call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clouseau.ir.errors import MissingExtraError
from clouseau.ir.flops import loop_factor, node_flops, total_flops
from clouseau.ir.graph import INSTRUMENTATION, Graph, NodeKind, Spec
from clouseau.ir.metadata import point_rows


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise MissingExtraError("pandas", "pandas") from None
    return pandas


def points_frame(graph: Graph) -> Any:
    """A pandas DataFrame with one row per point of ``graph``, in execution order.

    Columns: name, node, op, alias, shape, dtype, nbytes, module, module_type,
    module_params, flops (per call, loops included; None when unknown), source,
    intervention (the action, or None), saved, grad_saved.

    Raises
    ------
    clouseau.ir.errors.MissingExtraError
        pandas is not installed.
    """
    pd = _pandas()
    return _typed(pd.DataFrame(list(point_rows(graph).values())))


def capture_frame(records: Sequence[Any], graphs: Sequence[Graph]) -> Any:
    """A pandas DataFrame with one row per saved array of a capture (``Capture.to_pandas``).

    Parameters
    ----------
    records
        The capture's records (``Capture.records``): key, names, node, call, order, graph,
        index.
    graphs
        The capture's graphs by id (``Capture.graphs``); a record's metadata comes from
        the point of its graph. Gradients (``<name>.grad``) take their point's metadata.

    Returns
    -------
    pandas.DataFrame
        Columns: name, names, call, index, order, graph, key, grad, then the point columns
        of :func:`points_frame` (shape is the traced shape: a value saved under ``vmap``
        has the batch axis in front of it).
    """
    pd = _pandas()
    tables = [point_rows(g) for g in graphs]
    rows = []
    for record in records:
        name = record.names[0]
        grad = name.endswith(".grad")
        base = name[: -len(".grad")] if grad else name
        table = tables[record.graph] if record.graph < len(tables) else {}
        meta = {k: v for k, v in table.get(base, {}).items() if k != "name"}
        rows.append({
            "name": name, "names": tuple(record.names), "call": record.call,
            "index": tuple(record.index), "order": record.order, "graph": record.graph,
            "key": record.key, "grad": grad, **meta,
        })  # fmt: skip
    return _typed(pd.DataFrame(rows))


def _typed(frame: Any) -> Any:
    # Unknown FLOPs are missing values, not NaN floats: keep the column integral.
    if "flops" in frame:
        frame["flops"] = frame["flops"].astype("Int64")
    return frame


def summary(graph: Graph, *, file: Any = None) -> None:
    """Print the module tree of ``graph`` with output shapes, parameters and FLOPs.

    Parameters
    ----------
    graph
        The graph (instrumented or not: intervened points are marked).
    file
        Where to print (a text stream); standard output by default.
    """
    from rich.console import Console

    Console(file=file).print(summary_table(graph))


def summary_table(graph: Graph) -> Any:
    """The rich ``Table`` that :func:`summary` prints."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{graph.name or 'graph'} ({graph.trace_kind.value})", show_lines=False)
    for column, justify in (("name", "left"), ("type / op", "left"), ("output", "left"),
                            ("params", "right"), ("FLOPs", "right")):  # fmt: skip
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    specs = {p.name: p.spec for p in graph.points}
    intervened = {n.inputs[0].node: str(n.attr("action")) for n in graph.interventions}
    modules = {m.path: m for m in graph.modules}
    factors = loop_factor(graph)
    flops = {n.name: (node_flops(graph, n) or 0) * factors.get(n.name, 1) for n in graph.nodes}
    inside: dict[str, int] = {}
    for node in graph.nodes:
        for path in _ancestors(node.module):
            inside[path] = inside.get(path, 0) + flops[node.name]
    opened: set[str] = set()
    leaves: set[str] = set()  # modules whose call is one node (torch leaf modules)
    for node in graph.nodes:
        if node.kind in INSTRUMENTATION or node.kind in (NodeKind.CONSTANT, NodeKind.OUTPUT):
            continue
        chain = [p for p in _ancestors(node.module) if p in modules]
        if chain and (node.name == chain[-1] or chain[-1] in leaves):
            # A leaf module's call: one row with the module's type and parameters (a
            # second call of the same module, "relu_1", gets its own row likewise).
            leaf, chain = chain[-1], chain[:-1]
            leaves.add(leaf)
        else:
            leaf = ""
        for depth, path in enumerate(chain):
            if path not in opened:
                opened.add(path)
                table.add_row(
                    _indent(depth, path, chain[depth - 1] if depth else ""),
                    escape(modules[path].type),
                    _shape(specs.get(path)),
                    f"{modules[path].params:,}",
                    f"{inside.get(path, 0):,}",
                )
        opened.add(leaf)
        known = node_flops(graph, node) is not None
        table.add_row(
            _indent(len(chain), node.name, chain[-1] if chain else ""),
            escape(modules[leaf].type if leaf else node.op) + _mark(intervened.get(node.name)),
            ", ".join(_shape(s) for s in node.outputs),
            f"{modules[leaf].params:,}" if leaf else "",
            f"{flops[node.name]:,}" if known else "?",
        )
    root = modules.get("")
    total = root.params if root is not None else sum(m.params for m in graph.modules)
    table.add_section()
    table.add_row("total", "", "", f"{total:,}", f"{total_flops(graph):,}")
    return table


def _ancestors(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _indent(depth: int, name: str, parent: str) -> str:
    from rich.markup import escape

    short = name[len(parent) + 1 :] if parent and name.startswith(parent + ".") else name
    return escape("  " * depth + short)


def _mark(action: str | None) -> str:
    from rich.markup import escape

    return f" [red]<- {escape(action)}[/red]" if action else ""


def _shape(spec: Spec | None) -> str:
    from rich.markup import escape

    return "" if spec is None else escape(str(spec))
