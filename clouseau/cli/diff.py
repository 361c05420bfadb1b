"""``clouseau diff``: two captures compared point by point, in execution order."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from clouseau.cli import args as types
from clouseau.cli.args import Exit, add_width
from clouseau.cli.show import load_capture
from clouseau.cli.text import markup, printable

_MAX_ROWS = 60  # above this many rows, diff shows only the points that are not close


def add(sub: Any) -> None:
    """Register ``diff`` on the subcommand parsers ``sub``."""
    d = sub.add_parser(
        "diff", help="compare two captures point by point",
        description="Compare two captures point by point in execution order. Exits 1 when they differ.",
    )  # fmt: skip
    d.add_argument("a", type=types.existing_path, help="first capture directory")
    d.add_argument("b", type=types.existing_path, help="second capture directory")
    d.add_argument("--key-map", nargs=2, type=types.regex, action="append", default=[], metavar=("PATTERN", "REPLACEMENT"),
                   help="rewrite names of A with re.sub(PATTERN, REPLACEMENT) before looking them up in B (repeatable, applied in order)")  # fmt: skip
    d.add_argument("--rtol", type=types.tolerance, help="relative tolerance (default 1e-4)")
    d.add_argument("--atol", type=types.tolerance, help="absolute tolerance (default 1e-5)")
    d.add_argument(
        "--strict",
        action="store_true",
        help="points present on one side only count as a difference",
    )
    d.add_argument("--all", action="store_true", help="list every point, also when there are many")
    add_width(d)
    d.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:
    """Run ``clouseau diff``; the exit status."""
    from clouseau.store.diff import DEFAULT_ATOL, DEFAULT_RTOL, Status, diff

    sides = load_capture(args.a), load_capture(args.b)
    for side in sides:
        for name, why in sorted(side.damaged.items()):
            console.print(f"[bold red]⚠ damaged file {markup(name)} (skipped): {markup(why)}[/]")
    result = diff(
        *sides, key_map=[tuple(p) for p in args.key_map] or None,
        rtol=DEFAULT_RTOL if args.rtol is None else args.rtol,
        atol=DEFAULT_ATOL if args.atol is None else args.atol, strict=args.strict,
    )  # fmt: skip
    multi = len(result.calls) > 1
    rows = result.rows
    hidden = 0
    if not args.all and len(rows) > _MAX_ROWS:
        kept = tuple(r for r in rows if r.status is not Status.CLOSE)
        hidden = len(rows) - len(kept)
        rows = kept
    table = Table(title=f"{markup(args.a)} vs {markup(args.b)}", title_justify="left")
    for column in (
        "#",
        *(("call",) if multi else ()),
        "point",
        "status",
        "shape",
        "max abs",
        "max rel",
        "exceeding",
    ):
        table.add_column(
            column,
            justify="right"
            if column in ("#", "call", "max abs", "max rel", "exceeding")
            else "left",
            overflow="fold",  # a narrow --width wraps a cell, never elides it
        )
    first = result.first_divergence
    for i, r in enumerate(rows):
        style = _STATUS_STYLE[r.status.value] + (" reverse" if r is first else "")
        shape = _shape(r.shape_a if r.shape_a is not None else r.shape_b)
        if r.status is Status.SHAPE:
            shape = f"{_shape(r.shape_a)} vs {_shape(r.shape_b)}"
        numbers = (
            (f"{r.max_abs:.3g}", f"{r.max_rel:.3g}", f"{r.exceeding}/{r.size}")
            if r.status in (Status.CLOSE, Status.DIFFERS)
            else ("", "", "")
        )
        cells = (
            str(i),
            *((str(r.call),) if multi else ()),
            markup(r.label),
            Text(r.status.value, style=style),
            shape,
            *numbers,
        )
        table.add_row(*cells)
    console.print(table)
    if hidden:
        console.print(f"[dim]{hidden} close point(s) not listed; --all lists them[/]")
    style = "bold green" if result.ok else "bold red"
    console.print(Text(printable(result.summary()), style=style))
    return Exit.OK if result.ok else Exit.DIFFERS


_STATUS_STYLE = {
    "close": "green", "differs": "bold red", "shape mismatch": "bold magenta",
    "missing in b": "yellow", "missing in a": "yellow",
}  # fmt: skip


def _shape(shape: tuple[int, ...] | None) -> str:
    return "" if shape is None else "[" + ",".join(map(str, shape)) + "]"
