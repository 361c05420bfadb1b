"""Draw the IR with graphviz: ``clouseau.draw(source, "model.pdf")``.

The DOT text is built by clouseau from the IR (see ``_dot.py``); the ``dot`` program of
graphviz renders it to PDF, SVG or PNG. No Python graphviz package is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from clouseau.exporters._dot import DotOptions, graph_to_dot
from clouseau.exporters._output import write_output
from clouseau.ir.errors import CaptureError, ClouseauError
from clouseau.ir.graph import Graph
from clouseau.ir.selection import SelectLike
from clouseau.store.layout import graph_file

FORMATS = {".pdf": "pdf", ".svg": "svg", ".png": "png", ".dot": "dot", ".gv": "dot"}
GRAPH_FILE = graph_file(0)
INSTALL_HINT = (
    "install graphviz: apt-get install graphviz (Debian/Ubuntu), brew install graphviz "
    "(macOS), or conda install -c conda-forge graphviz"
)


class GraphvizNotFoundError(ClouseauError, FileNotFoundError):
    """The graphviz ``dot`` program is not on PATH; the .dot file was written anyway."""


class RenderError(ClouseauError, RuntimeError):
    """``dot`` failed to render the DOT text."""


def draw(
    source: Any,
    output: str | os.PathLike[str],
    select: SelectLike = None,
    *,
    depth: int | None = None,
    rollup: bool = False,
    rankdir: str = "TB",
    constants: bool = False,
    compact: bool | None = None,
    title: str | None = None,
) -> Path:
    """Draw a traced graph to ``output``; the format follows its suffix.

    Parameters
    ----------
    source
        An IR :class:`~clouseau.Graph`, an instrumented model (its last traced graph), or
        a capture directory (drawn from its stored ``graph-000.json``; no model needed).
    output
        ``.pdf``, ``.svg``, ``.png`` (rendered by graphviz's ``dot``) or ``.dot`` (text).
    select
        Points to highlight, as for ``instrument``; save nodes already in the graph are
        highlighted too.
    depth
        Draw module clusters ``depth`` levels deep; each module one level deeper becomes a
        single box (``depth=0``: every top-level module is a box). ``None`` draws all.
    rollup
        Draw runs of identical numbered sibling blocks once, labelled ``layer1.* ×2``.
    rankdir
        Graphviz direction: ``"TB"`` (top to bottom) or ``"LR"`` (left to right).
    constants
        Also draw parameters and buffers (hidden by default to keep the graph small).
    compact
        Label nodes with their last name component only; by default on for large graphs.
    title
        The graph title; by default the graph's name and frontend.

    Returns
    -------
    Path
        The written file.

    Raises
    ------
    GraphvizNotFoundError
        ``dot`` is not installed; the DOT text is still written next to ``output``.
    """
    output = Path(output)
    fmt = FORMATS.get(output.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"cannot tell the format of {output}: use a .pdf, .svg, .png or .dot suffix"
        )
    if rankdir not in ("TB", "LR", "BT", "RL"):
        raise ValueError(f"rankdir must be TB, LR, BT or RL; got {rankdir!r}")
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be >= 0 or None; got {depth}")
    graph = graph_of(source)
    options = DotOptions(
        depth=depth,
        rollup=rollup,
        rankdir=rankdir,
        constants=constants,
        compact=compact,
        title=title,
    )
    text = graph_to_dot(graph, select, options)
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "dot":
        return write_output(output, text.encode())
    render(text, output, fmt)
    return output


def to_dot(graph: Graph, select: SelectLike = None, **options: Any) -> str:
    """The DOT text :func:`draw` renders (same keyword options)."""
    return graph_to_dot(graph_of(graph), select, DotOptions(**options))


def render(text: str, output: Path, fmt: str) -> None:
    """Render DOT ``text`` to ``output`` with graphviz's ``dot``.

    ``dot`` writes to a pipe, never to a file it opens by name: the output (and the DOT
    text kept when rendering fails) is written by :func:`write_output`, exclusively and
    never through a link.
    """
    exe = shutil.which("dot")
    if exe is None:
        dot_file = write_output(output.with_suffix(".dot"), text.encode())
        raise GraphvizNotFoundError(
            f"cannot render {output.name}: the graphviz program 'dot' is not on PATH; "
            f"{INSTALL_HINT}. The graph was written to {dot_file}; render it later with "
            f"dot -T{fmt} {dot_file} -o {output}"
        )
    done = subprocess.run(
        [exe, f"-T{fmt}"], input=text.encode(), capture_output=True, timeout=300, check=False
    )
    if done.returncode != 0:
        dot_file = write_output(output.with_suffix(".dot"), text.encode())
        raise RenderError(
            f"dot failed to render {output.name} (exit {done.returncode}): "
            f"{done.stderr.decode(errors='replace').strip()[:2000]}; the DOT text is in {dot_file}"
        )
    write_output(output, done.stdout)


def graph_of(source: Any) -> Graph:
    """The IR graph behind ``source``: a Graph, an instrumented model or a capture directory."""
    if isinstance(source, Graph):
        return source
    if isinstance(source, str | os.PathLike):
        return _graph_from_directory(Path(source))
    graph = _graph_from_model(source)
    if graph is not None:
        return graph
    raise TypeError(
        f"cannot draw a {type(source).__name__}: pass a clouseau Graph (clouseau.trace), an "
        "instrumented model that has been called (or traced with fmodel.trace(*args)), or a "
        "capture directory"
    )


def _graph_from_model(model: Any) -> Graph | None:
    """The newest graph an instrumented model traced (its capture records every signature)."""
    for attr in ("graph", "last_graph"):
        value = getattr(model, attr, None)
        if isinstance(value, Graph):
            return value
    if not hasattr(type(model), "captured"):
        return None
    graphs = getattr(model.captured, "graphs", ())
    if not graphs:
        raise ClouseauError(
            "this instrumented model has not traced a graph yet: call it once, or call "
            "fmodel.trace(*example_args), before drawing it"
        )
    return graphs[-1]


def _graph_from_directory(path: Path) -> Graph:
    if path.is_file() and path.suffix == ".json":
        file = path
    elif path.is_dir():
        file = path / GRAPH_FILE
        if not file.exists():
            raise CaptureError(
                f"{path} holds no {GRAPH_FILE}: it is not a clouseau capture directory (or the "
                "model was never called). Pass the directory given to clouseau.instrument(path=...)"
            )
    else:
        raise CaptureError(
            f"{path} does not exist; pass a capture directory, a Graph or an instrumented model"
        )
    try:
        return Graph.from_json(json.loads(file.read_text()))
    except (ValueError, KeyError, TypeError) as err:
        raise CaptureError(
            f"{file} is not a valid clouseau graph ({type(err).__name__}: {err})"
        ) from None
