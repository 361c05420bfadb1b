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
