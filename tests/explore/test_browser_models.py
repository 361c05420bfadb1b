"""The explorer in a real browser on real models: torchvision ResNet-50 and Hugging Face GPT-2.

Every number read from the page is checked against the framework itself (forward hooks on
the original model) or against Python (``select_points``, ``clouseau.diff``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import clouseau
from clouseau.ir.selection import select_points

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")


def _capture(model: Any, x: Any, path: Path, select: Any = "*") -> clouseau.Capture:
    with clouseau.instrument(model, select=select, path=path) as fmodel:
        fmodel(x)
    return clouseau.load(path)


def _hooked(module: Any, model: Any, x: Any) -> list[np.ndarray]:
    """Every output of ``module`` while ``model(x)`` runs eagerly, in call order."""
    outputs: list[np.ndarray] = []
    handle = module.register_forward_hook(
        lambda _m, _i, out: outputs.append(out.detach().clone().numpy())
    )
    with torch.no_grad():
        model(x)
    handle.remove()
    return outputs


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    root = tmp_path_factory.mktemp("resnet")
    cap = _capture(model, x, root / "a")
    # The same model with one layer perturbed: the diff's first divergence is that layer.
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.layer2[1].conv2.weight.mul_(1.5)
    _capture(other, x, root / "b")
    return {"model": model, "x": x, "cap": cap, "a": root / "a", "b": root / "b"}


def _stats_row(opened: Any, call: int = 0) -> dict[str, tuple[str, str]]:
    row = opened.page.locator(f'#panel table.stats tr[data-call="{call}"] td[data-stat]')
    return {
        cell.get_attribute("data-stat"): (cell.get_attribute("data-value"), cell.inner_text())
        for cell in row.all()
    }


def _check_stats(cells: dict[str, tuple[str, str]], array: np.ndarray) -> None:
    x = array.astype(np.float64)
    finite = x[np.isfinite(x)]
    expected = {
        "mean": finite.mean(),
        "std": finite.std(),
        "min": finite.min(),
        "max": finite.max(),
    }
    for key, value in expected.items():
        full, shown = cells[key]
        assert float(full) == pytest.approx(value, rel=1e-6, abs=1e-9), key
        assert float(shown.replace(",", "")) == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert int(cells["zeros"][0]) == np.count_nonzero(x == 0)
    assert int(cells["nan"][0]) == np.isnan(x).sum()
    assert int(cells["inf"][0]) == np.isinf(x).sum()


def _non_blank(png: Path) -> None:
    from PIL import Image

    image = np.asarray(Image.open(png).convert("L"))
    assert image.std() > 5 and len(np.unique(image)) > 20, f"{png} looks blank"


def test_resnet50_expand_collapse_search_click(resnet: dict[str, Any], open_report: Any,
                                               tmp_path: Path) -> None:  # fmt: skip
    report = clouseau.explore(resnet["a"], tmp_path / "resnet.html")
    opened = open_report(report)
    page = opened.page
    first = opened.shot(tmp_path / "1-opened.png")
    _non_blank(first)
    # Bottleneck blocks start collapsed: expanding one lays out its operations.
    assert page.locator('.node[data-name="layer2.0.conv1"]').count() == 0
    opened.show("layer2.0").dblclick()
    page.wait_for_selector('.node[data-name="layer2.0.conv1"]')
    assert page.locator('.cluster[data-path="layer2.0"]').count() == 1
    opened.shot(tmp_path / "2-expanded.png")
    opened.show("layer2.0.conv1").click()
    page.keyboard.press("c")  # collapse the module around the selected node
    page.wait_for_selector('.node.group[data-path="layer2.0"]')
    assert page.locator('.node[data-name="layer2.0.conv1"]').count() == 0
    opened.shot(tmp_path / "3-collapsed.png")

    pattern = "layer3.*.relu*"
    expected = len(select_points(resnet["cap"].graph, pattern))
    page.fill("#search", pattern)
    page.press("#search", "Enter")
    assert expected == 18
    assert page.locator(".node.match").count() == expected
    assert page.get_attribute("#search-count", "data-points") == str(expected)
    opened.shot(tmp_path / "4-search.png")

    # layer3.0.relu is the first of the three calls of the block's ReLU module.
    opened.show("layer3.0.relu").click()
    assert page.inner_text("#panel h2") == "layer3.0.relu"
    hooked = _hooked(resnet["model"].layer3[0].relu, resnet["model"], resnet["x"])
    _check_stats(_stats_row(opened), hooked[0])
    assert page.locator("#panel .hist svg rect").count() == 24
    opened.shot(tmp_path / "5-panel.png")

    # Keyboard: down moves to the consumer of the selected node.
    page.keyboard.press("ArrowDown")
    assert page.inner_text("#panel h2") == "layer3.0.conv2"
    assert opened.network() == []


def test_resnet50_diff_highlights_the_perturbed_layer(resnet: dict[str, Any], open_report: Any,
                                                      tmp_path: Path) -> None:  # fmt: skip
    result = clouseau.diff(resnet["a"], resnet["b"])
    assert result.first_divergence is not None
    assert result.first_divergence.name == "layer2.1.conv2"
    report = clouseau.explore(result, tmp_path / "diff.html")
    opened = open_report(report)
    page = opened.page
    marked = page.locator(".node.first-div")
    assert marked.count() == 1
    assert marked.get_attribute("data-name") == "layer2.1.conv2"
    # The panel opens on it with its errors, and the path from the input leads to it.
    assert page.inner_text("#panel h2") == "layer2.1.conv2"
    row = next(r for r in result.rows if r.name == "layer2.1.conv2")
    shown = page.locator('#panel table.diff td[data-stat="rel"]').first.inner_text()
    assert float(shown) == pytest.approx(row.max_rel, rel=1e-5)
    path = page.locator("#panel .path li").all_inner_texts()
    assert path[0] == "x" and path[-1] == "layer2.1.conv2"
    assert page.locator(".edge.div-path").count() >= 1
    # Nothing before the perturbed layer diverges; its consumers do.
    assert page.locator('.node.diverges[data-name="layer2.1.conv1"]').count() == 0
    assert page.locator('.node.diverges[data-name="layer2.1.bn2"]').count() == 1
    _non_blank(opened.shot(tmp_path / "diff.png"))
    assert opened.network() == []


def test_gpt2_capture(open_report: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                     n_positions=32, use_cache=False, bos_token_id=0,
                                     eos_token_id=0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 128, (1, 8))
    cap = _capture(model, ids, tmp_path / "gpt2")
    report = clouseau.explore(tmp_path / "gpt2", tmp_path / "gpt2.html")
    opened = open_report(report)
    page = opened.page
    pattern = "transformer.h.*.mlp.c_fc"
    expected = len(select_points(cap.graph, pattern))
    page.fill("#search", pattern)
    page.press("#search", "Enter")
    assert expected == 2 and page.locator(".node.match").count() == expected
    name = "transformer.h.1.mlp.c_fc"
    node = cap.graph.point(name).node.name  # a module's output is an alias of its last op
    assert node != name
    opened.show(name)
    page.locator(f'.node[data-name="{node}"]').click()
    assert name in page.inner_text("#panel .stats-title")
    hooked = _hooked(model.transformer.h[1].mlp.c_fc, model, ids)
    _check_stats(_stats_row(opened), hooked[0])
    _non_blank(opened.shot(tmp_path / "gpt2.png"))
    assert opened.network() == []
