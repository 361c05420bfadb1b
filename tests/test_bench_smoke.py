"""Smoke test of the benchmark suite: one comparison runs end to end and reports every variant.

Tiny models, quick mode, no timing assertions: a benchmark never fails the test suite, this
only guards the harness (subprocess worker, interleaving, report rendering) against rot.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

# Imported after the skips: bench_torch imports torch at module level.
import bench.__main__ as bench_main
from bench import bench_torch

VARIANTS = [
    bench_torch.PLAIN,
    bench_torch.FLOOR_ACT,
    bench_torch.FLOOR_ALL,
    bench_torch.NONE,
    bench_torch.ACT_MEM,
    bench_torch.ACT_DISK,
    bench_torch.ALL_DISK,
    bench_torch.HOOKS_ACT,
    bench_torch.HOOKS_ALL,
]


def test_smallest_comparison_reports_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    argv = ["--tiny", "--out", str(out), "--workdir", str(tmp_path / "work"), "torch-mlp"]
    assert bench_main.main(argv) == 0
    text = out.read_text()
    assert "## Machine" in text and "## Targets" in text
    for name in VARIANTS:
        assert f"| {name} |" in text, f"variant {name!r} missing from the table"


def test_peers_overhead_reports_every_tool(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from bench import bench_peers_extra

    out = tmp_path / "RESULTS.md"
    argv = ["--tiny", "--out", str(out), "--workdir", str(tmp_path / "work"), "peers-overhead"]
    assert bench_main.main(argv) == 0
    text = out.read_text()
    for name in (
        bench_peers_extra.PLAIN,
        bench_peers_extra.HOOKS,
        bench_peers_extra.NNSIGHT,
        bench_peers_extra.HOOK_PATH,
        bench_peers_extra.TRACED,
        bench_peers_extra.NONE,
    ):
        assert f"| {name} |" in text, f"variant {name!r} missing from the table"
    # Every clouseau variant ran (its values equal forward hooks' before timing).
    for name in (bench_peers_extra.HOOK_PATH, bench_peers_extra.TRACED):
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        assert "skipped" not in row and "failed" not in row, row
    assert "peers.png" in text  # drawn, or a line saying why not
