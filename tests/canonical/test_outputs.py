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


def test_computed_points_are_selected_only_by_a_glob_naming_them() -> None:
    from clouseau.ir.selection import select_points

    family = BY_NAME["gpt2"]
    graph = clouseau.trace(family.model(), **family.inputs())
    computed = {p.name for p in graph.points if p.op == "computed"}
    assert {"blocks.0.attn.scores", "blocks.1.logit_lens", "blocks.0.attn.head_out"} <= computed
    # A bare "*" (or a wildcard leaf) costs no extra work: it saves what the model holds.
    for glob in ("*", "blocks.0.attn.*", "*lens"):
        assert not computed & {p.name for p in select_points(graph, glob, strict=False)}
    assert {p.name for p in select_points(graph, "logit_lens")} == {
        "blocks.0.logit_lens", "blocks.1.logit_lens"
    }  # fmt: skip
    picked = {p.name for p in select_points(graph, "blocks.*.attn.scores")}
    assert picked == {"blocks.0.attn.scores", "blocks.1.attn.scores"}
