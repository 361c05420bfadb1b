"""``clouseau explore``: one self-contained HTML page of a capture, or of a diff of two."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape

from clouseau.cli import args as types
from clouseau.cli.args import Exit


def add(sub: Any) -> None:
    """Register ``explore`` on the subcommand parsers ``sub``."""
    ex = sub.add_parser(
        "explore", help="write an interactive HTML explorer of a capture (or of a diff of two)",
        description="Write one self-contained HTML page (no network, no server) of the graph "
        "stored in a capture directory, with per-call statistics of every saved point; given "
        "two directories, of their diff, the first divergence highlighted.",
    )  # fmt: skip
    ex.add_argument("path", type=types.existing_path, help="capture directory")
    ex.add_argument("other", nargs="?", type=types.existing_path, help="second capture directory: explore the diff")  # fmt: skip
    ex.add_argument("-o", "--output", type=types.html_output, default="report.html", help="the .html file (default report.html)")  # fmt: skip
    ex.add_argument("--depth", type=types.count(), help="module levels open when the page opens")
    ex.add_argument("--rtol", type=types.tolerance, default=None, help="relative tolerance of the diff")  # fmt: skip
    ex.add_argument("--atol", type=types.tolerance, default=None, help="absolute tolerance of the diff")  # fmt: skip
    ex.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:
    """Run ``clouseau explore``; the exit status."""
    from clouseau._explore import explore

    options = {k: v for k, v in (("rtol", args.rtol), ("atol", args.atol)) if v is not None}
    if options and args.other is None:
        raise ValueError("--rtol and --atol apply to a diff: give a second capture directory")
    source = args.path if args.other is None else (args.path, args.other)
    out = explore(source, args.output, depth=args.depth, **options)
    console.print(f"wrote {escape(str(out))}")
    return Exit.OK
