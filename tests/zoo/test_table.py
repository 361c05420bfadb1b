"""docs/models.md and the README's counts are the sweep's results (bench/zoo/results.jsonl)."""

from __future__ import annotations

from pathlib import Path

from bench.zoo import report
from bench.zoo.__main__ import RESULTS

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_counts_are_the_results() -> None:
    outcomes = report.load(RESULTS)
    assert outcomes, "bench/zoo/results.jsonl holds the sweep's results"
    rendered = report.render(outcomes).splitlines()
    page = (ROOT / "docs" / "models.md").read_text()
    start = rendered.index("## Counts")
    rows = [line for line in rendered[start:] if line.startswith("| ")][:5]
    for row in rows:
        assert row in page, f"docs/models.md is stale; run ./dev.sh zoo --report ({row})"
    for outcome in outcomes:
        assert f"| `{outcome.name}` |" in page


def test_the_readme_quotes_the_counts() -> None:
    outcomes = report.load(RESULTS)
    readme = (ROOT / "README.md").read_text()
    assert "docs/models.md" in readme
    for family in report.TARGETS:
        c = report.counts(outcomes, family)
        assert f"{family} {c['supported']}/{c['ran']}" in readme, family
