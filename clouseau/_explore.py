"""``clouseau.explore``: resolve a source into what the explorer page shows; notebook reprs.

This is the API layer: it may read captures (``clouseau.store``) and hand plain data to the
exporter (``clouseau.exporters.explore``), which imports neither. It also gives ``Graph``,
``Capture`` and ``DiffResult`` their ``_repr_html_`` (the explorer in an iframe) and their
``__rich__`` (a table), attached here so that ``clouseau/ir`` and ``clouseau/store`` need
not know the exporter exists.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clouseau.ir.errors import ClouseauError
from clouseau.ir.graph import Graph
from clouseau.store.array_stats import array_stats
from clouseau.store.capture import Capture
from clouseau.store.diff import DiffResult
from clouseau.store.diff import diff as diff_captures

# A notebook cell shows the page in an iframe this tall (pixels).
NOTEBOOK_HEIGHT = 560


def explore(
    source: Any,
    output: str | os.PathLike[str] | None = None,
    *,
    depth: int | None = None,
    title: str | None = None,
    **diff_options: Any,
) -> Path | str:
    """Write one self-contained, interactive HTML page of a graph, a capture or a diff.

    Parameters
    ----------
    source
        A :class:`~clouseau.Graph`; an instrumented model (its last graph and what it has
        captured); a capture directory or :class:`~clouseau.Capture` (graph + per-call
        statistics of every saved point); a :class:`~clouseau.store.diff.DiffResult` of
        two capture directories, or a pair ``(a, b)`` of captures to compare (errors per
        point, first divergence highlighted).
    output
        The ``.html`` file to write; ``None`` returns the HTML text instead.
    depth
        Module levels expanded when the page opens; by default the deepest level that
        keeps the first view to a few hundred boxes.
    title
        The page title; by default the graph's name.
    **diff_options
        For a pair ``(a, b)``: ``key_map``, ``rtol``, ``atol``, as for :func:`clouseau.diff`.

    Returns
    -------
    Path or str
        The written file, or the HTML text when ``output`` is None.
    """
    from clouseau.exporters.explore import render_page, write_page

    if depth is not None and depth < 0:
        raise ValueError(f"depth must be >= 0 or None; got {depth}")
    data = explore_input(source, depth=depth, title=title, **diff_options)
    if output is None:
        return render_page(data)
    if Path(output).suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"the explorer writes HTML: give output a .html suffix, not {output}")
    return write_page(data, output)


def explore_input(source: Any, *, depth: int | None = None, title: str | None = None,
                  **diff_options: Any) -> Any:  # fmt: skip
    """The exporter's ``ExploreInput`` for ``source`` (see :func:`explore`)."""
    from clouseau.exporters.explore import ExploreInput

    if diff_options and not _is_pair(source):
        raise TypeError(
            f"{', '.join(diff_options)} only apply when source is a pair (a, b) of captures"
        )
    if isinstance(source, Graph):
        return ExploreInput(source, title or "", depth=depth)
    if _is_pair(source):
        source = diff_captures(source[0], source[1], **diff_options)
        return _from_diff(source, _capture(_side(source.a)), depth, title)
    if isinstance(source, DiffResult):
        return _from_diff(source, _capture(_side(source.a)), depth, title)
    if isinstance(source, Capture | str | os.PathLike):
        cap = _capture(source)
        return ExploreInput(_graph(cap), title or _label(cap), _arrays(cap), depth=depth)
    return _from_model(source, depth, title)


def _is_pair(source: Any) -> bool:
    return isinstance(source, tuple | list) and len(source) == 2


def _side(label: str) -> Path:
    path = Path(label)
    if not path.is_dir():
        raise ClouseauError(
            f"this diff compared {label!r}, which is not a capture directory, so its graph "
            "cannot be found: pass the two captures instead, clouseau.explore((a, b), ...)"
        )
    return path


def _capture(source: Any) -> Capture:
    from clouseau.store import load

    return source if isinstance(source, Capture) else load(source)


def _graph(cap: Capture) -> Graph:
    if cap.graph is None:
        raise ClouseauError(
            f"{_label(cap)} holds no graph (graph-000.json): it was not written by an "
            "instrumented model, so there is nothing to lay out"
        )
    return cap.graph


def _label(cap: Capture) -> str:
    return str(cap.path) if cap.path else "capture"


def _arrays(cap: Capture) -> dict[str, list[tuple[int, np.ndarray]]]:
    calls: dict[str, list[int]] = {}
    for record in cap.records:
        for name in record.names:
            seen = calls.setdefault(name, [])
            if record.call not in seen:
                seen.append(record.call)
    return {name: [(c, cap.get(name, call=c)) for c in cs] for name, cs in calls.items()}


def _from_diff(result: DiffResult, cap: Capture, depth: int | None, title: str | None) -> Any:
    from clouseau.exporters.explore import ExploreInput, PointError

    errors = tuple(
        PointError(
            r.name,
            r.call,
            r.status.value,
            r.status.diverges,
            r.max_abs,
            r.max_rel,
            r.exceeding,
            r.size,
        )
        for r in result.rows
        if r.name
    )
    first = result.first_divergence
    return ExploreInput(
        _graph(cap),
        title or f"diff {result.a} vs {result.b}",
        _arrays(cap),
        errors,
        first.name if first is not None else "",
        result.summary(),
        depth,
    )


def _from_model(model: Any, depth: int | None, title: str | None) -> Any:
    from clouseau.exporters.explore import ExploreInput
    from clouseau.exporters.graphviz import graph_of

    try:
        graph = graph_of(model)
    except TypeError:
        raise TypeError(
            f"cannot explore a {type(model).__name__}: pass a clouseau Graph, an instrumented "
            "model that has been called, a capture directory or Capture, a DiffResult, or a "
            "pair (a, b) of captures"
        ) from None
    captured = getattr(model, "captured", None)
    arrays = _arrays(captured) if isinstance(captured, Capture) else {}
    return ExploreInput(graph, title or "", arrays, depth=depth)


# -- notebook and terminal display --------------------------------------------------------
def _repr_html(source: Any) -> str:
    page = explore(source)
    assert isinstance(page, str)
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width:100%;'
        f'height:{NOTEBOOK_HEIGHT}px;border:1px solid #d8dee9" sandbox="allow-scripts">'
        "</iframe>"
    )


def capture_table(cap: Capture) -> Any:
    """A rich table of a capture: one row per point and call, with its statistics."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=repr(cap))
    for column in ("name", "call", "shape", "dtype", "mean", "std", "min", "max", "NaN", "inf"):
        table.add_column(column, justify="left" if column in ("name", "dtype") else "right")
    for name, calls in _arrays(cap).items():
        for call, array in calls:
            s = array_stats(array)
            bad = "[bold red]" if not s.finite else ""
            table.add_row(escape(name), str(call), str(list(array.shape)), str(array.dtype),
                          *(f"{v:.4g}" for v in (s.mean, s.std, s.min, s.max)),
                          f"{bad}{s.nan}", f"{bad}{s.inf}")  # fmt: skip
    return table


def diff_table(result: DiffResult) -> Any:
    """A rich table of a diff: one row per point and call; diverging rows in red."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(result.summary()))
    for column in ("point", "call", "status", "max abs", "max rel", "exceeding"):
        table.add_column(column, justify="left" if column in ("point", "status") else "right")
    first = result.first_divergence
    for r in result.rows:
        style = "bold red" if r is first else ("red" if r.status.diverges else None)
        table.add_row(escape(r.label), str(r.call), r.status.value, f"{r.max_abs:.3g}",
                      f"{r.max_rel:.3g}", f"{r.exceeding}/{r.size}", style=style)  # fmt: skip
    return table


def _graph_rich(graph: Graph) -> Any:
    from clouseau.ir.tables import summary_table

    return summary_table(graph)


def install_reprs(kinds: Sequence[type] = (Graph, Capture, DiffResult)) -> None:
    """Give ``kinds`` the explorer as ``_repr_html_`` and a rich table as ``__rich__``."""
    tables = {Graph: _graph_rich, Capture: capture_table, DiffResult: diff_table}
    for kind in kinds:
        kind._repr_html_ = _repr_html  # type: ignore[attr-defined]
        kind.__rich__ = tables[kind]  # type: ignore[attr-defined]
