"""The graphviz exporter: DOT text pinned by golden files, rendering, sources, options.

Regenerate the golden files with ``CLOUSEAU_UPDATE_GOLDEN=1 pytest tests/exporters``.
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import clouseau
from clouseau.exporters.graphviz import GraphvizNotFoundError, draw, to_dot
from clouseau.ir import SelectionError, insert_saves, verify
from tests.conftest import check_golden
from tests.exporters.graphs import resnet_graph, transformer_graph

GOLDEN = Path(__file__).parent / "golden"
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="graphviz 'dot' is not installed")


def saved_resnet() -> clouseau.Graph:
    return verify(insert_saves(resnet_graph(), ["relu*", "layer2.0"]))


def test_golden_hand_built_resnet() -> None:
    check_golden(GOLDEN / "resnet_ir.dot", to_dot(saved_resnet()))


def test_dot_has_clusters_highlights_and_shapes() -> None:
    text = to_dot(saved_resnet())
    assert 'subgraph "cluster_layer1"' in text and 'subgraph "cluster_layer1.0"' in text
    assert "<B>layer1.0</B> (BasicBlock)" in text
    assert "<B>layer2.0.downsample</B> (Sequential)" in text
    # A leaf-module call is a box in its block, not a cluster of its own.
    assert "cluster_layer1.0.conv1" not in text and "cluster_layer1.0.relu" not in text
    assert text.count('fillcolor="#ffd54f"') == 9  # stem relu + 2 per block; layer2.0 is a relu_1
    assert "saved as layer2.0" in text
    assert 'label=" [2,16,8,8]"' in text
    assert "shape=invhouse" in text and "shape=house" in text


def test_non_float32_edges_carry_the_dtype() -> None:
    text = to_dot(transformer_graph(layers=1))
    assert 'label=" i64[2,16]"' in text and 'label=" [2,16,64]"' in text


def test_depth_collapses_deeper_modules() -> None:
    text = to_dot(saved_resnet(), depth=1)
    assert 'subgraph "cluster_layer1"' in text
    assert '"m:layer1.0" [label=<<B>layer1.0</B><BR/><FONT POINT-SIZE="8">BasicBlock' in text
    assert "layer1.0.conv1" not in text
    assert '"m:layer1.0" -> "m:layer1.1"' in text
    top = to_dot(saved_resnet(), depth=0)
    assert "cluster_" not in top and '"m:layer1"' in top and '"m:layer2"' in top


def test_rollup_draws_identical_blocks_once() -> None:
    text = to_dot(saved_resnet(), rollup=True)
    assert "layer1.* ×2" in text and "layer1.*.conv1" in text
    assert "layer1.1.conv1" not in text
    # layer2's blocks differ (downsample), so both stay.
    assert "layer2.0.conv1" in text and "layer2.1.conv1" in text
    big = to_dot(transformer_graph(layers=12), rollup=True)
    assert "layers.* ×12" in big and "layers.11" not in big
    assert big.count("->") < 20


def test_large_graph_gets_compact_labels() -> None:
    text = to_dot(transformer_graph(layers=12))
    assert "<B>layers.3</B> (Block)" in text  # clusters keep full paths
    assert "<B>qkv</B>" in text and "<B>layers.3.attn.qkv</B>" not in text
    assert 'tooltip="layers.3.attn.qkv"' in text  # the full name stays in the tooltip
    assert "<B>layers.0.attn.qkv</B>" in to_dot(transformer_graph(layers=2))


def test_select_highlights_and_rejects_unknown_names() -> None:
    text = to_dot(resnet_graph(), select="layer1.0.add")
    assert text.count('fillcolor="#ffd54f"') == 1
    with pytest.raises(SelectionError, match="closest"):
        to_dot(resnet_graph(), select="no_such_layer")


def test_rankdir_and_bad_arguments(tmp_path: Path) -> None:
    assert "rankdir=LR" in to_dot(resnet_graph(), rankdir="LR")
    with pytest.raises(ValueError, match="suffix"):
        draw(resnet_graph(), tmp_path / "g.jpeg")
    with pytest.raises(TypeError, match="cannot draw"):
        draw(42, tmp_path / "g.dot")


@needs_dot
@pytest.mark.parametrize("suffix", [".pdf", ".svg", ".png", ".dot"])
def test_render_formats(tmp_path: Path, suffix: str) -> None:
    out = clouseau.draw(saved_resnet(), tmp_path / f"g{suffix}")
    data = out.read_bytes()
    assert out == tmp_path / f"g{suffix}" and len(data) > 500
    if suffix == ".pdf":
        assert data.startswith(b"%PDF-")
    elif suffix == ".png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
    elif suffix == ".svg":
        root = ET.fromstring(data)
        assert root.tag.endswith("svg")
        texts = [t.strip() for t in root.itertext() if t.strip()]
        assert "layer1.0" in texts and "(BasicBlock)" in texts and "layer2.1.relu_1" in texts
    else:
        assert data.decode().startswith('digraph "ResNet"')


def test_missing_dot_says_how_to_install_and_writes_the_dot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(GraphvizNotFoundError) as info:
        clouseau.draw(saved_resnet(), tmp_path / "g.pdf")
    message = str(info.value)
    assert (
        "apt-get install graphviz" in message
        and "brew install graphviz" in message
        and "conda" in message
    )
    assert isinstance(info.value, clouseau.ClouseauError)
    assert (tmp_path / "g.dot").read_text() == to_dot(saved_resnet())
    assert not (tmp_path / "g.pdf").exists()


def test_capture_directory_without_graph_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(clouseau.CaptureError, match=r"graph-000\.json"):
        clouseau.draw(tmp_path, tmp_path / "g.dot")
    with pytest.raises(clouseau.CaptureError, match="does not exist"):
        clouseau.draw(tmp_path / "nope", tmp_path / "g.dot")


# -- with the torch frontend ----------------------------------------------------------------
def test_golden_torch_resnet(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.exporters.models import resnet

    model = resnet().eval()
    import torch

    fmodel = clouseau.instrument(model, select=["relu*", "layer2.0"], path=tmp_path / "cap")
    graph = fmodel.trace(torch.randn(2, 3, 16, 16))
    text = to_dot(graph)
    check_golden(GOLDEN / "resnet_torch.dot", text)
    assert "<B>layer1.0</B> (BasicBlock)" in text and "saved" in text
    # The same picture from the instrumented model, and from the capture directory alone.
    with fmodel:
        fmodel(torch.randn(2, 3, 16, 16))
    assert to_dot(clouseau.load(tmp_path / "cap").graph) == text
    assert clouseau.draw(fmodel, tmp_path / "m.dot").read_text() == text
    assert clouseau.draw(tmp_path / "cap", tmp_path / "d.dot").read_text() == text


def test_untraced_instrumented_model_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.exporters.models import resnet

    fmodel = clouseau.instrument(resnet(), select="relu*", path=None)
    with pytest.raises(clouseau.ClouseauError, match="trace"):
        clouseau.draw(fmodel, tmp_path / "g.dot")
