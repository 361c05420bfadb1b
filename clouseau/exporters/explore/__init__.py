"""The interactive explorer: one self-contained HTML page of a graph, a capture or a diff.

``clouseau.explore(source, "report.html")`` (and ``clouseau explore DIR``) resolve their
source in the API layer and call :func:`write_page` with an :class:`ExploreInput`: the IR
graph, the statistics of the saved arrays by point name, and the rows of a diff. This
package imports only ``clouseau.ir``, numpy and the exporters' file writer.

Why dagre, laid out in the browser
----------------------------------
The page must re-layout whenever a module group is expanded or collapsed, and lay out only
what is shown: a 5,000-node graph opens with its deep modules collapsed to a few hundred
boxes and expanding a group costs a layout of the boxes now visible. Laying out in Python
with graphviz would fix the layout when the file is written (one layout per expansion
state is not possible) and would add a system dependency. So the layout runs in the page,
with dagre (``@dagrejs/dagre`` 3.1.3 from the npm registry, MIT licence, maintained by the
dagrejs organisation): a layered (Sugiyama) layout made for directed graphs of operations,
with compound (nested cluster) support for expanded modules, in one 49 kB file with no
dependencies. ELK (``elkjs``) gives nicer orthogonal routing but is ~1.4 MB and runs best
in a worker; dagre's size keeps each report (and each notebook cell) small. The built file
``vendor/dagre.min.js`` is vendored unchanged except for its source-map comment (so that no
browser looks for a ``.map`` file), with its licence in ``vendor/LICENSE-dagre.txt``; both
ship as package data. Nothing is fetched at run time: the page's Content-Security-Policy
forbids every network request.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from string import Template

from clouseau.exporters._output import write_output
from clouseau.exporters.explore._payload import ExploreInput, build_payload
from clouseau.exporters.explore._stats import CallStats, PointError, call_stats

__all__ = ["CallStats", "ExploreInput", "PointError", "call_stats", "render_page", "write_page"]


def _asset(name: str) -> str:
    return (resources.files(__package__) / name).read_text(encoding="utf-8")


def script_json(payload: object) -> str:
    """JSON text safe inside a ``<script>`` element: ``<``, ``>``, ``&`` are escaped."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def render_page(data: ExploreInput) -> str:
    """The HTML text of the explorer for ``data`` (see :class:`ExploreInput`)."""
    import html

    payload = build_payload(data)
    return Template(_asset("static/page.html")).substitute(
        title=html.escape(str(payload["title"])),
        css=_asset("static/explorer.css"),
        data=script_json(payload),
        dagre=_asset("vendor/dagre.min.js"),
        js=_asset("static/explorer.js"),
    )


def write_page(data: ExploreInput, output: str | os.PathLike[str]) -> Path:
    """Write the explorer page of ``data`` to ``output`` (written whole to an exclusive
    temporary file, never through a link, then renamed)."""
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_output(path, render_page(data).encode("utf-8"))
