"""``clouseau show``, ``draw`` and ``export-onnx``."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

import clouseau
from clouseau.cli import main, parse_input
from clouseau.ir import insert_saves
from clouseau.store.array_stats import array_stats
from tests.cli.test_diff import arrays, write_capture
from tests.exporters.graphs import resnet_graph


def written_with_graph(path: Path) -> Path:
    """A capture of the hand-built ResNet IR (no framework), two relu outputs with NaN in one."""
    from clouseau.ir import SavedValue
    from clouseau.store import DirectorySink

    graph = insert_saves(resnet_graph(), ["layer1.0.relu", "layer1.0.relu_1", "layer1.0", "fc"])
    rng = np.random.default_rng(0)
    sink = DirectorySink(path)
    gid = sink.add_graph(graph)
    call = sink.begin_call()
    values = []
    for save in graph.saves:
        names = tuple(save.attr("names"))
        spec = graph.point(names[0]).spec
        array = rng.normal(size=spec.shape).astype(np.float32)
        if names[0] == "layer1.0.relu_1":
            array[0, 0, 0, :3] = np.nan
            array[1, 0, 0, 0] = np.inf
        values.append(SavedValue(names, save.inputs[0].node, array))
    sink.put(call, gid, values)
    sink.end_call(call)
    sink.close()
    return path


def test_show_prints_a_module_tree_and_flags_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = written_with_graph(tmp_path / "cap")
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ResNet (torch.fx)" in out
    assert "layer1 (Sequential)" in out and "layer1.0 (BasicBlock)" in out
    assert "relu_1 (aka layer1.0)" in out and "float32[2,8,16,16]" in out
    assert "NaN×3" in out and "Inf×1" in out
    assert "1 point(s) hold NaN or Inf; first: layer1.0.relu_1" in out


def test_show_stats_match_numpy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = arrays()
    path = write_capture(tmp_path / "cap", [values])
    assert main(["show", str(path), "--stats", "--select", "fc"]) == 0
    out = capsys.readouterr().out
    fc = values["fc"].astype(np.float64)
    for label, want in (
        ("mean", fc.mean()),
        ("std", fc.std()),
        ("min", fc.min()),
        ("max", fc.max()),
    ):
        assert f"{label} {want:.4g}" in out
    assert "conv" not in out and "NaN" not in out


def test_show_values_and_calls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_capture(tmp_path / "cap", [arrays(0), arrays(1)])
    assert main(["show", str(path), "--values", "--call", "1", "--select", "relu"]) == 0
    out = capsys.readouterr().out
    assert f"{arrays(1)['relu'].max():.4f}" in out
    assert "call 1" not in out  # one call shown: no per-call level
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "call 0" in out and "call 1" in out
    assert main(["show", str(path), "--call", "5"]) == 2
    assert main(["show", str(path), "--select", "nothing*"]) == 2


def test_array_stats_over_finite_values() -> None:
    a = np.array([1.0, np.nan, 3.0, -np.inf], np.float32)
    stats = array_stats(a)
    assert (stats.nan, stats.inf, stats.mean, stats.min, stats.max) == (1, 1, 2.0, 1.0, 3.0)
    assert not stats.finite


def test_magnify_describes_an_array_with_the_same_statistics() -> None:
    from clouseau.inspector._view import describe

    a = np.array([[1.0, np.nan], [3.0, -np.inf], [2.0, 8.0]], np.float32)
    stats = array_stats(a)
    text = describe(a)
    assert text.startswith("float32[3,2]")
    for key, value in (("mean", stats.mean), ("std", stats.std), ("min", stats.min)):
        assert f"{key}={value:.4g}" in text
    assert f"non-finite={stats.nan + stats.inf}" in text
    assert "no finite values" in describe(np.array([np.nan]))


def test_show_select_matches_as_instrument_does(tmp_path: Path) -> None:
    from clouseau.ir.selection import select_points, stored_selector

    path = written_with_graph(tmp_path / "cap")
    cap = clouseau.load(path)
    for pattern in (["relu*"], ["layer1.*"], ["add"], ["*", "!relu*"]):
        by_graph = {p.name for p in select_points(cap.graph, pattern, strict=False)}
        selected = stored_selector(pattern, cap.graph)
        stored = {r.names for r in cap.records}
        assert {names for names in stored if selected(names)} == {
            names for names in stored if set(names) & by_graph
        }, pattern
    # a name the graph does not have is matched by name alone
    assert stored_selector(["*.grad"], cap.graph)(("fc.grad",))
    assert not stored_selector(["linear"], None)(("fc.grad",))


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz 'dot' is not installed")
def test_draw_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = written_with_graph(tmp_path / "cap")
    out = tmp_path / "g.svg"
    assert main(["draw", str(path), "-o", str(out), "--depth", "1", "--rollup"]) == 0
    assert out.read_text().lstrip().startswith("<?xml")
    assert main(["draw", str(path), "-o", str(tmp_path / "g.dot"), "--select", "layer1.0.add"]) == 0
    assert "layer1.0.add" in (tmp_path / "g.dot").read_text()


def test_draw_without_dot_exits_2_and_writes_dot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = written_with_graph(tmp_path / "cap")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert main(["draw", str(path), "-o", str(tmp_path / "g.png")]) == 2
    err = capsys.readouterr().err
    assert "apt-get install graphviz" in err and "Traceback" not in err
    assert (tmp_path / "g.dot").exists()


def test_parse_input() -> None:
    assert parse_input("2,3,32,32") == ((2, 3, 32, 32), "float32")
    assert parse_input("2,16:int64") == ((2, 16), "int64")
    with pytest.raises(ValueError, match="comma-separated"):
        parse_input("two,three")


def test_export_onnx_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    spec = tmp_path / "mymodels.py"
    spec.write_text(
        textwrap.dedent("""
        import torch

        def make():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    """)
    )
    out = tmp_path / "m.onnx"
    argv = ["export-onnx", f"{spec}:make", "--input", "3,8", "--select", "1", "-o", str(out)]
    assert main(argv) == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["output", "1"]
    assert main(["export-onnx", f"{spec}:nope", "--input", "3,8"]) == 2
    assert "no attribute" in capsys.readouterr().err
    assert main(["export-onnx", "not_a_spec", "--input", "3,8"]) == 2
