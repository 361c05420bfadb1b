"""The docs site builds with ``mkdocs build --strict``, and its reference is complete."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import clouseau
from clouseau import inspector
from tests.docs.blocks import ROOT

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings_handlers.python")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _anchors(site: Path, page: str) -> set[str]:
    return set(re.findall(r'id="(clouseau[\w.]*)"', (site / page / "index.html").read_text()))


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        relative = page.relative_to(ROOT / "docs").with_suffix("")
        built = site / ("" if relative.name == "index" else relative) / "index.html"
        assert built.with_name("index.html").exists(), f"{page.name} was not built"


def test_the_api_reference_documents_every_public_name(site: Path) -> None:
    anchors = _anchors(site, "reference/api")
    expected = {f"clouseau.{name}" for name in clouseau.__all__}
    expected |= {f"clouseau.inspector.{name}" for name in inspector.__all__}
    expected |= {
        f"clouseau.Capture.{name}"
        for name, _ in inspect.getmembers(clouseau.Capture)
        if not name.startswith("_") and name in vars(clouseau.Capture)
    }
    expected |= {"clouseau.cli.main", "clouseau.capture.torch.mark_leaf"}
    assert expected - anchors == set()


def test_the_cli_reference_holds_the_generated_help(site: Path) -> None:
    from docs._hooks import cli_help

    text = (site / "cli" / "index.html").read_text()
    for command in ("show", "diff", "draw", "export-onnx"):
        assert f"usage: clouseau {command}" in text
    assert "--width N" in cli_help("show") and "--width N" in text


def test_the_explorer_page_embeds_the_quickstart_reports(site: Path) -> None:
    page = (site / "explorer" / "index.html").read_text()
    assert '<iframe src="report.html"' in page
    for report in ("report.html", "diff.html"):
        html = (site / "explorer" / report).read_text()
        assert "quickstart ResNet" in html and "layer2.0.conv2" in html
