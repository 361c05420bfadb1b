"""``clouseau draw``: the graph stored in a capture directory, drawn with graphviz."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape

from clouseau.cli import args as types
from clouseau.cli.args import Exit


def add(sub: Any) -> None:
    """Register ``draw`` on the subcommand parsers ``sub``."""
    dr = sub.add_parser(
        "draw",
        help="draw the graph of a capture",
        description="Draw the graph stored in a capture directory (.pdf .svg .png .dot).",
    )
    dr.add_argument("path", type=types.existing_path, help="capture directory")
    dr.add_argument(
        "-o",
        "--output",
        type=types.draw_output,
        default="graph.pdf",
        help="output file; the suffix picks the format (default graph.pdf)",
    )
    dr.add_argument(
        "--select",
        action="append",
        type=types.glob,
        metavar="GLOB",
        help="also highlight points matching GLOB",
    )
    dr.add_argument(
        "--depth",
        type=types.count(),
        help="collapse modules deeper than DEPTH into single boxes",
    )
    dr.add_argument(
        "--rollup", action="store_true", help="draw runs of identical blocks once (layer1.* ×2)"
    )
    dr.add_argument(
        "--rankdir", default="TB", choices=("TB", "LR", "BT", "RL"), help="layout direction"
    )
    dr.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:
    """Run ``clouseau draw``; the exit status."""
    from clouseau.api import draw

    out = draw(
        args.path,
        args.output,
        select=args.select,
        depth=args.depth,
        rollup=args.rollup,
        rankdir=args.rankdir,
    )
    console.print(f"wrote {escape(str(out))}")
    return Exit.OK
