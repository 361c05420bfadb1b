"""Canonical names and computed points in a capture directory: load, show, draw, explore."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import clouseau
from clouseau.cli import main
from tests.canonical.families import BY_NAME


def test_a_capture_of_canonical_and_computed_points_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    family = BY_NAME["llama"]
    model = family.model()
    select = ["blocks.*.resid_post", "pattern", "logit_lens"]
    with (
        clouseau.instrument(model, select=select, path=tmp_path / "cap") as fmodel,
        torch.no_grad(),
    ):
        logits = fmodel(**family.inputs()).logits
    cap = clouseau.load(tmp_path / "cap")
    assert {"blocks.1.resid_post", "blocks.0.attn.pattern", "blocks.1.logit_lens"} <= set(
        cap.names()
    )
    assert cap.graph.node("blocks.0.attn.pattern").op == "computed"
    assert (cap["blocks.1.logit_lens"] == logits.numpy()).all()
    assert main(["show", str(tmp_path / "cap"), "--select", "pattern"]) == 0
    assert "pattern" in capsys.readouterr().out
    clouseau.draw(tmp_path / "cap", tmp_path / "g.dot", select="blocks.0.*")
    assert "blocks.0.attn.pattern" in (tmp_path / "g.dot").read_text()
    clouseau.explore(tmp_path / "cap", tmp_path / "r.html")
    assert "blocks.0.attn.pattern" in (tmp_path / "r.html").read_text()
