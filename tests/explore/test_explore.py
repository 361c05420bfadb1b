"""``clouseau.explore`` and ``clouseau explore`` without a browser: sources, files, errors,
the notebook and terminal displays, and the document the page reads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

import clouseau
from clouseau.cli import main
from clouseau.exporters.explore import ExploreInput, PointError, call_stats
from clouseau.exporters.explore._payload import build_payload
from clouseau.ir.errors import ClouseauError
from tests.explore.graphs import EVIL, big_graph, evil_graph

torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: Any) -> Any:
        return self.head(self.body(x))


def _capture(path: Path, scale: float = 1.0, calls: int = 1) -> tuple[Net, list[Any]]:
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.head.weight.mul_(scale)
    xs = [torch.randn(3, 4) for _ in range(calls)]
    with clouseau.instrument(net, select="*", path=path) as fmodel:
        for x in xs:
            fmodel(x)
    return net, xs


def _document(html: str) -> dict[str, Any]:
    text = re.search(
        r'<script id="clouseau-data" type="application/json">(.*?)</script>', html, re.S
    )
    assert text is not None
    return json.loads(text.group(1))


def test_capture_directory_carries_per_call_statistics(tmp_path: Path) -> None:
    net, xs = _capture(tmp_path / "cap", calls=2)
    doc = _document(clouseau.explore(tmp_path / "cap"))
    names = [n["n"] for n in doc["nodes"]]
    relu = names.index("body.1")
    stats = doc["stats"][str(relu)]
    assert stats["names"][0] == "body.1"
    for call, x in enumerate(xs):
        eager = net.body(x).detach().numpy().astype(np.float64)
        got = stats["calls"][call]
        assert got["c"] == call and got["shape"] == [3, 8]
        assert got["mean"] == pytest.approx(eager.mean()) and got["max"] == pytest.approx(
            eager.max()
        )
        assert got["zeros"] == np.count_nonzero(eager == 0)
        assert sum(got["hist"][2]) == eager.size
    assert doc["diff"] is None


def test_diff_pair_marks_the_first_divergence_and_its_path(tmp_path: Path) -> None:
    _capture(tmp_path / "a")
    _capture(tmp_path / "b", scale=2.0)
    result = clouseau.diff(tmp_path / "a", tmp_path / "b")
    doc = _document(clouseau.explore((tmp_path / "a", tmp_path / "b")))
    names = [n["n"] for n in doc["nodes"]]
    assert result.first_divergence is not None
    assert doc["diff"]["firstName"] == result.first_divergence.name == "head"
    assert names[doc["diff"]["first"]] == "head"
    assert [names[i] for i in doc["diff"]["path"]] == ["x", "body.0", "body.1", "head"]
    row = doc["diff"]["rows"][str(names.index("head"))][0]
    assert row["rel"] == pytest.approx(result.first_divergence.max_rel)
    assert doc["diff"]["summary"] == result.summary()
    # The same page from the DiffResult itself.
    assert _document(clouseau.explore(result))["diff"]["first"] == doc["diff"]["first"]


def test_instrumented_model_and_graph_sources(tmp_path: Path) -> None:
    net = Net()
    fmodel = clouseau.instrument(net, select="body.*", path=None)
    with fmodel:
        fmodel(torch.randn(2, 4))
    doc = _document(clouseau.explore(fmodel))
    assert {doc["nodes"][int(i)]["n"] for i in doc["stats"]} == {"body.0", "body.1"}
    graph = clouseau.trace(net, torch.randn(2, 4))
    out = clouseau.explore(graph, tmp_path / "sub" / "graph.html", depth=0, title="mine")
    page = out.read_text()
    assert _document(page)["depth"] == 0 and "<title>mine</title>" in page


def test_page_is_self_contained() -> None:
    page = clouseau.explore(big_graph(blocks=2))
    assert "default-src 'none'" in page  # the page's policy forbids every request
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "sourceMappingURL" not in page
    assert "@import" not in page and "url(" not in page


def test_markup_is_escaped_in_the_document() -> None:
    page = clouseau.explore(evil_graph())
    assert "<script>alert" not in page and "<img src=x" not in page
    assert page.count("<script") == 3  # the data, dagre and the explorer
    doc = _document(page)
    assert doc["nodes"][1]["n"] == f"{EVIL}.relu"
    assert any(g["p"] == EVIL for g in doc["groups"])


def test_huge_graph_opens_collapsed_with_a_note() -> None:
    doc = build_payload(ExploreInput(big_graph(blocks=500)))
    assert len(doc["nodes"]) == 50_002
    assert doc["depth"] == 0 and "50,002 nodes" in doc["note"]
    # A module with more operations than a page should lay out at once is chunked.
    flat = build_payload(ExploreInput(big_graph(blocks=1, subs=1, ops=450)))
    chunks = [g for g in flat["groups"] if g.get("syn")]
    assert len(chunks) == 3 and all(g["up"] > 0 for g in chunks)


def test_non_finite_values_travel_as_strings() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 2.0, 4.0], dtype=np.float32)
    stats = call_stats(0, x).to_json()
    assert (stats["nan"], stats["inf"], stats["zeros"]) == (1, 2, 1)
    assert stats["mean"] == pytest.approx(2.0) and stats["min"] == 0.0
    empty = call_stats(1, np.array([np.nan, np.inf]))
    assert np.isnan(empty.mean) and empty.hist == ()
    row = PointError("a", 0, "differs", True, np.inf, np.nan, 1, 2)
    doc = build_payload(ExploreInput(big_graph(1, 1, 2), errors=(row,), first="a",
                                     arrays={"blocks.0.sub0.add": [(0, x)]}))  # fmt: skip
    text = json.dumps(doc, allow_nan=False)  # no bare NaN/Infinity reaches the page
    assert '"nan"' in text


def test_cli_explore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _capture(tmp_path / "a")
    _capture(tmp_path / "b", scale=2.0)
    out = tmp_path / "r.html"
    assert main(["explore", str(tmp_path / "a"), "-o", str(out)]) == 0
    assert _document(out.read_text())["stats"]
    assert (
        main(["explore", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out), "--rtol", "0.1"])
        == 0
    )
    assert _document(out.read_text())["diff"]["firstName"] == "head"
    assert main(["explore", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["explore", str(tmp_path / "a"), "--atol", "1"]) == 2
    assert "second capture directory" in capsys.readouterr().err


def test_bad_sources_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="cannot explore a int"):
        clouseau.explore(3)
    with pytest.raises(ValueError, match=r"\.html suffix"):
        clouseau.explore(big_graph(1, 1, 1), tmp_path / "x.pdf")
    with pytest.raises(TypeError, match="only apply when source is a pair"):
        clouseau.explore(big_graph(1, 1, 1), rtol=0.1)
    with pytest.raises(ValueError, match="depth must be"):
        clouseau.explore(big_graph(1, 1, 1), depth=-1)
    result = clouseau.diff({"a": np.ones(2)}, {"a": np.zeros(2)})
    with pytest.raises(ClouseauError, match="pass the two captures instead"):
        clouseau.explore(result)


def test_notebook_and_terminal_displays(tmp_path: Path) -> None:
    _capture(tmp_path / "a")
    _capture(tmp_path / "b", scale=2.0)
    cap = clouseau.load(tmp_path / "a")
    result = clouseau.diff(tmp_path / "a", tmp_path / "b")
    for obj in (cap, cap.graph, result):
        shown = obj._repr_html_()
        assert shown.startswith("<iframe srcdoc=") and "&lt;script" in shown
        assert "<script" not in shown  # the page is inside the attribute, escaped
    console = Console(record=True, width=200)
    console.print(cap)
    console.print(result)
    console.print(cap.graph)
    text = console.export_text()
    assert "body.1" in text and "NaN" in text and "head" in text and "differs" in text


def test_jax_capture_with_a_loop(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def f(x: Any) -> Any:
        def body(c: Any, xi: Any) -> Any:
            c = jnp.tanh(c + xi)
            return c, c * 2

        _, ys = jax.lax.scan(body, x[0], x)
        return jax.nn.relu(ys).sum()

    x = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
    with clouseau.instrument(f, select="*", path=tmp_path / "cap") as fmodel:
        fmodel(x)
    doc = _document(clouseau.explore(tmp_path / "cap"))
    names = [n["n"] for n in doc["nodes"]]
    _, ys = jax.jit(lambda x: jax.lax.scan(lambda c, xi: (jnp.tanh(c + xi),) * 2, x[0], x))(x)
    relu = np.asarray(jax.nn.relu(ys * 2), dtype=np.float64)
    got = doc["stats"][str(names.index("relu"))]["calls"][0]
    assert got["shape"] == [3, 4] and got["zeros"] == np.count_nonzero(relu == 0)
    assert got["mean"] == pytest.approx(relu.mean(), rel=1e-6)
    # Values saved once per iteration of the loop come stacked, one row per iteration.
    assert doc["stats"][str(names.index("scan.tanh"))]["calls"][0]["shape"] == [3, 4]
