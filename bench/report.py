"""What a comparison hands back, and how RESULTS.md renders it.

A worker process returns a :class:`Report` as JSON: the variant results (rendered as one
table of medians and ratios), any extra tables (first-call costs, scaling series), and the
target checks, each marked met or missed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.harness import Result, result_from_json, result_to_json


@dataclass
class Check:
    """One target of the issue: ``measured`` compared with ``limit`` by ``op``."""

    target: str
    measured: float
    limit: float
    op: str  # "<=", "<" or ">="
    unit: str = "x"
    detail: str = ""

    @property
    def met(self) -> bool | None:
        """True/False, or None when the measurement is missing (a variant did not run)."""
        if self.measured is None or math.isnan(self.measured):
            return None
        return {
            "<=": self.measured <= self.limit,
            "<": self.measured < self.limit,
            ">=": self.measured >= self.limit,
        }[self.op]


@dataclass
class Table:
    """A free-form table: a title, a header and rows of already formatted cells."""

    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Report:
    """Everything one comparison measured."""

    name: str
    title: str
    description: str = ""
    results: list[Result] = field(default_factory=list)
    baselines: dict[str, str] = field(default_factory=dict)  # variant -> its floor variant
    plain: str = ""  # the variant every row is divided by in the "x plain" column
    tables: list[Table] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    seconds: float = math.nan

    def result(self, name: str) -> Result | None:
        return next((r for r in self.results if r.name == name), None)

    def ratio(self, num: str, den: str) -> float:
        """median(num) / median(den), NaN when either did not run."""
        a, b = self.result(num), self.result(den)
        if a is None or b is None or not a.ok or not b.ok:
            return math.nan
        return a.median / b.median

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["results"] = [result_to_json(r) for r in self.results]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Report:
        d = dict(d)
        d["results"] = [result_from_json(r) for r in d.get("results", [])]
        d["tables"] = [Table(**t) for t in d.get("tables", [])]
        d["checks"] = [Check(**c) for c in d.get("checks", [])]
        if d.get("seconds") is None:
            d["seconds"] = math.nan
        return cls(**d)


# -- formatting -----------------------------------------------------------------------------
def fmt_s(seconds: float) -> str:
    """A duration with a unit that keeps three significant digits."""
    if seconds is None or math.isnan(seconds):
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def fmt_x(ratio: float) -> str:
    return "—" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}x"


def fmt_mb(mb: float) -> str:
    return "—" if mb is None or math.isnan(mb) else f"{mb:.0f}"


def verdict(check: Check) -> str:
    return {True: "**met**", False: "**MISSED**", None: "not measured"}[check.met]


def variant_table(report: Report) -> list[str]:
    """The Markdown table of one comparison's variants."""
    lines = [
        "| variant | median / call | spread (IQR) | x plain | vs floor | CPU / call | peak RSS growth (MiB) | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report.results:
        if r.skip is not None or r.error is not None:
            why = f"skipped: {r.skip}" if r.skip is not None else f"failed: {r.error}"
            lines.append(f"| {r.name} | — | — | — | — | — | — | {_cell(why)} |")
            continue
        floor = report.baselines.get(r.name)
        vs_floor = f"{fmt_x(report.ratio(r.name, floor))} ({floor})" if floor else ""
        lines.append(
            f"| {r.name} | {fmt_s(r.median)} | {r.spread() * 100:.0f}% | "
            f"{fmt_x(report.ratio(r.name, report.plain))} | {vs_floor} | {fmt_s(r.cpu_median)} | "
            f"{fmt_mb(r.peak)} | "
            f"{_cell(r.note)} |"
        )
    return lines


def free_table(t: Table) -> list[str]:
    lines = [f"| {' | '.join(t.header)} |", "|" + "---|" * len(t.header)]
    lines += [f"| {' | '.join(_cell(c) for c in row)} |" for row in t.rows]
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
