"""The ``clouseau`` command: show, diff, draw and explore captures; export models to ONNX.

One module per subcommand (``show``, ``diff``, ``draw``, ``explore``, ``export_onnx``), each
with ``add`` (its arguments) and ``run``; ``args`` holds the strict argument types and the
exit statuses, ``text`` makes text from a capture safe to print (README.md maps them).

Exit status: 0 on success, 1 when ``diff`` finds a difference, 2 on a user error (a
malformed argument, a bad path, not a capture, no shared names, graphviz missing), 130
when interrupted (Ctrl-C). Errors print one message, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from clouseau.cli import diff, draw, explore, export_onnx, show
from clouseau.cli.args import Exit, StrictParser, one_line, parse_input
from clouseau.cli.export_onnx import load_factory, make_inputs
from clouseau.cli.text import markup
from clouseau.ir.errors import ClouseauError

__all__ = ["load_factory", "main", "make_inputs", "parse_input"]

# In the order ``clouseau --help`` lists them.
_SUBCOMMANDS = (show, diff, draw, explore, export_onnx)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``clouseau`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    A malformed argument exits with status 2 and one line on stderr while parsing; an error
    while the command runs returns 2 after one ``error:`` message; never a traceback.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help (0) or a malformed argument (2, already reported)
        return done.code if isinstance(done.code, int) else Exit.USAGE
    console = Console(highlight=False, soft_wrap=True, width=_width(args))
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return int(args.run(args, console))
    except (ClouseauError, OSError, ValueError, KeyError, TypeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        errors.print(f"[bold red]error:[/] {markup(message)}")
        return Exit.USAGE
    except Exception as err:  # the user's model code may raise anything
        errors.print(
            f"[bold red]error:[/] {markup(type(err).__name__)}: {markup(one_line(str(err)))}"
        )
        return Exit.USAGE
    except KeyboardInterrupt:
        errors.print("[bold red]interrupted[/]")
        return Exit.INTERRUPTED


def _width(args: argparse.Namespace) -> int | None:
    """The output width: ``--width``, else the terminal's, else unlimited (a pipe or a log)."""
    if getattr(args, "width", None) is not None:
        return int(args.width)
    # Rich falls back to 80 columns off a terminal; cutting there would lose data.
    return None if sys.stdout.isatty() else 100_000


def _parser() -> argparse.ArgumentParser:
    parser = StrictParser(
        prog="clouseau",
        description="Inspect, compare and draw activation captures; export models to ONNX.",
        epilog="Exit status: 0 success, 1 diff found a difference, 2 user error, 130 interrupted.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _SUBCOMMANDS:
        command.add(sub)
    return parser
