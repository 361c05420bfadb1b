"""What a comparison hands back, and how RESULTS.md renders it.

A worker process returns a :class:`Report` as JSON: the variant results (rendered as one
table of medians and ratios), any extra tables (first-call costs, scaling series), and the
target checks, each marked met or missed.

``python -m bench.report --merge FILE [--into bench/RESULTS.md]`` splices the sections of a
report written with ``python -m bench ... --out FILE`` into RESULTS.md: see :func:`merge`.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
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


# -- merging one run's sections into RESULTS.md ------------------------------------------------
_HEADING = re.compile(r"^(#{1,6}) (.*)$")
_SECTION_TAG = re.compile(r"\(`([^`]+)`\)\s*$")  # "## Title (`peers-disk`)"
_GROUP_TAG = re.compile(r"\(`([^`]+)`, [^)]*\)\s*$")  # "## Title (`peers-*`, a separate run)"
_SECONDS = re.compile(r"^_\d+ s_$")
_AGAINST = re.compile(r"\s*\(against [^)]*\)$")  # the best peer's name changes run to run
TARGETS = "Targets"


@dataclass(frozen=True)
class _Heading:
    index: int
    level: int
    text: str


def _headings(lines: list[str]) -> list[_Heading]:
    found = (_HEADING.match(line) for line in lines)
    return [_Heading(i, len(m[1]), m[2].strip()) for i, m in enumerate(found) if m]


def _span_end(lines: list[str], head: _Heading) -> int:
    """The index just past ``head``'s section: the next heading of its level or above."""
    later = (h.index for h in _headings(lines) if h.index > head.index and h.level <= head.level)
    return next(later, len(lines))


def _tag(text: str, pattern: re.Pattern[str]) -> str | None:
    m = pattern.search(text)
    return m[1] if m else None


def _target_key(row: str) -> str:
    return _AGAINST.sub("", row.split(" | ")[0].removeprefix("| ").strip())


@dataclass(frozen=True)
class _Run:
    """What merge takes from a generated report: its header, targets and sections."""

    header: tuple[str, ...]
    targets: tuple[str, ...]
    sections: tuple[tuple[str, str, tuple[str, ...]], ...]  # (name, title, body)


def _parse_run(text: str) -> _Run:
    lines = text.splitlines()
    heads = _headings(lines)
    by_text = {h.text: h for h in heads if h.level == 2}
    if TARGETS not in by_text:
        raise ValueError("not a report of `python -m bench --out FILE`: it has no '## Targets'")
    machine = by_text.get("Machine")
    rows = [] if machine is None else lines[machine.index + 1 : _span_end(lines, machine)]
    split = (tuple(c.strip() for c in r.strip()[1:-1].split(" | ")) for r in rows if r[:2] == "| ")
    cells = [c for c in split if len(c) == 2 and c[0]]
    paragraphs = [line for line in lines if line.startswith("Generated by ")][:1]
    if cells:
        paragraphs.append("Machine: " + "; ".join(f"{k}: {v}" for k, v in cells) + ".")
    paragraphs += [line for line in lines if line.startswith("> **Warning:**")][:1]
    header = [line for p in paragraphs for line in (p, "")][:-1]
    head = by_text[TARGETS]
    targets = [r for r in lines[head.index + 3 : _span_end(lines, head)] if r.startswith("| ")]
    sections = []
    for h in heads:
        name = _tag(h.text, _SECTION_TAG) if h.level == 2 else None
        if name is None:
            continue
        body = lines[h.index + 1 : _span_end(lines, h)]
        ends = [i for i, line in enumerate(body) if _SECONDS.match(line)]
        sections.append((name, h.text, tuple(body[: ends[-1] + 1] if ends else body)))
    return _Run(tuple(header), tuple(targets), tuple(sections))


def _place(lines: list[str], name: str) -> tuple[int, int, int]:
    """Where section ``name`` goes in RESULTS.md: (start, end, heading level)."""
    heads = _headings(lines)
    for h in heads:
        if _tag(h.text, _SECTION_TAG) == name:
            return h.index, _span_end(lines, h), h.level
    for h in heads:
        group = _tag(h.text, _GROUP_TAG)
        if group is not None and fnmatch.fnmatchcase(name, group):
            end = _span_end(lines, h)
            return end, end, h.level + 1
    return len(lines), len(lines), 2


def _targets_span(lines: list[str], at: int, level: int) -> tuple[int, int] | None:
    """The Targets section that governs a section at ``lines[at]`` of heading ``level``."""
    before = [h for h in _headings(lines) if h.index < at]
    for h in reversed(before):
        if h.level < level and level > 2:
            return None  # left the section's group without meeting its Targets
        if h.text == TARGETS and h.level == level:
            return h.index, _span_end(lines, h)
    return None


def _merge_targets(lines: list[str], span: tuple[int, int], targets: tuple[str, ...]) -> None:
    start, end = span
    for row in targets:
        hits = [i for i in range(start, end) if lines[i].startswith("| ")]
        same = [i for i in hits if _target_key(lines[i]) == _target_key(row)]
        for i in same:
            lines[i] = row
        if not same and hits:
            first_table_end = next(
                (i for i in range(hits[0], end) if not lines[i].startswith("|")), end
            )
            lines.insert(first_table_end, row)
            end += 1


def merge(results: str, report: str) -> str:
    """RESULTS.md text ``results`` with the sections of the generated ``report`` merged in.

    A section (a heading ending in ``(`name`)``) replaces the one of RESULTS.md with the same
    name, at that heading's level, with the report's header (the command, the date, the
    machine, the load warning) kept with it. A section RESULTS.md lacks goes at the end of the
    group whose tag matches its name (``(`peers-*`, a separate run)``), or at the end. Each
    target row replaces the rows of the same target (the best peer's name aside) in the
    Targets section governing the first merged section; a new target is appended to its
    first table.

    Parameters
    ----------
    results : str
        The current RESULTS.md.
    report : str
        A report written by ``python -m bench ... --out FILE``.

    Returns
    -------
    str
        The merged RESULTS.md.
    """
    run = _parse_run(report)
    if not run.sections:
        raise ValueError("the report has no section tagged (`name`) to merge")
    lines = results.splitlines()
    span = None
    for name, title, body in run.sections:
        start, end, level = _place(lines, name)
        new = [f"{'#' * level} {title}", "", *run.header, "", *_strip(body), ""]
        if start == end and start > 0 and lines[start - 1].strip():
            new.insert(0, "")  # an appended heading after a paragraph
        lines[start:end] = new
        if span is None:
            span = _targets_span(lines, start, level) or _targets_span(lines, start, 2)
    if span is not None:
        _merge_targets(lines, span, run.targets)
    return "\n".join(lines).rstrip("\n") + "\n"


def _strip(body: tuple[str, ...]) -> list[str]:
    lines = list(body)
    while lines and not lines[0].strip():
        lines.pop(0)
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report --merge FILE [--into RESULTS.md]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.report",
        description="Merge the sections of one run's report into RESULTS.md: each replaces "
        "the section of the same name (with the run's header kept beside it), new ones "
        "join their group, and the run's target rows replace those of the same targets.",
    )
    p.add_argument("--merge", required=True, help="a report of `python -m bench --out FILE`")
    default = Path(__file__).resolve().parent / "RESULTS.md"
    p.add_argument("--into", default=str(default), help=f"the file to update ({default})")
    args = p.parse_args(argv)
    into = Path(args.into)
    try:
        text = merge(into.read_text(), Path(args.merge).read_text())
    except ValueError as e:
        print(f"{args.merge}: {e}", file=sys.stderr)
        return 2
    into.write_text(text)
    print(f"merged {args.merge} into {into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
