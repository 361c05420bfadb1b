"""Numbers and texts in the docs' prose that no code block shows, checked against the code."""

from __future__ import annotations

import itertools
import re

import pytest

from clouseau.cli import main
from tests.docs.blocks import ROOT


def _page(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def test_the_count_of_onnx_jax_primitives() -> None:
    pytest.importorskip("jax")
    from clouseau.exporters._jax_rules import RULES

    found = re.search(r"lowers the jaxpr itself \((\d+) primitives", _page("drawing.md"))
    assert found and int(found.group(1)) == len(RULES)


def test_the_cli_page_quotes_a_real_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    quoted = re.search(r"prints one line,\s+`([^`]+)`", _page("cli.md"), re.S)
    assert quoted
    assert main(["export-onnx", "m.py:f", "--input", "2,x"]) == 2
    line = capsys.readouterr().err.strip()
    shown = " ".join(quoted.group(1).split()).removesuffix(" ...")
    assert line.startswith(shown)


def test_the_errors_page_quotes_real_cli_lines(capsys: pytest.CaptureFixture[str]) -> None:
    page = _page("errors.md")
    assert main(["export-onnx", "m.py:f", "--input", "2,8:int7"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.split(", bfloat16")[0] in page
    assert main(["draw", ".", "-o", "/nonexistent/dir/x.pdf"]) == 2
    assert (
        "the directory '/nonexistent/dir' of '/nonexistent/dir/x.pdf' does not exist; create it first"
        in capsys.readouterr().err
    )
    assert "the directory '/nonexistent/dir' of ... does not exist; create it first" in page


def test_the_resnet_names_on_the_names_page() -> None:
    torchvision = pytest.importorskip("torchvision")
    import torch

    import clouseau

    found = re.search(r"ResNet the names are\s+`([^`]+)`", _page("names.md"))
    if not found:
        pytest.skip("names.md no longer lists the ResNet names")
    names = clouseau.trace(torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64)).names()
    shown = [n.strip() for n in " ".join(found.group(1).split()).split(",")]
    # The list elides runs with "...": each shown name is a point, in execution order.
    listed = [n for n in shown if n != "..."]
    assert [n for n in names if n in listed] == listed
    assert shown[0] == names[0] and shown[-1] == names[-1]
    for a, b in itertools.pairwise(shown):  # no "..." between: next to each other
        if "..." not in (a, b):
            assert names.index(b) == names.index(a) + 1, (a, b)
