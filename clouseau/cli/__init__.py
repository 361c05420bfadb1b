"""The ``clouseau`` command: show, diff, draw and explore captures; export models to ONNX.

Exit status: 0 on success, 1 when ``diff`` finds a difference, 2 on a user error (a
malformed argument, a bad path, not a capture, no shared names, graphviz missing), 130
when interrupted (Ctrl-C). Errors print one message, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from clouseau import _cli_args as types
from clouseau._cli_args import StrictParser, one_line, parse_input
from clouseau._cli_export import cmd_export, load_factory, make_inputs
from clouseau._cli_text import markup, printable
from clouseau.ir.errors import ClouseauError

__all__ = ["load_factory", "main", "make_inputs", "parse_input"]

EXIT_OK, EXIT_DIFFERS, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C (128 + SIGINT)
_MAX_ROWS = 60  # above this many rows, diff shows only the points that are not close

_EXPORT_HELP = """\
Export a model to ONNX with the selected activations as extra named outputs.

MODEL is a factory spec, MODULE:ATTR, where MODULE is an importable module
(mypkg.models) or a path to a Python file (models/resnet.py), and ATTR names
either a model object (a torch.nn.Module or an Equinox module) or a class or
function that builds one when called with no arguments.

Each --input gives the shape of one positional argument, as comma-separated
positive sizes with an optional dtype: 2,3,32,32 or 2,16:int64 (float32 by
default). The dtypes:
  {dtypes}.
Example inputs are random (normal for floats, 0..9 for ints) from --seed. The
directory of -o must exist.

  clouseau export-onnx mypkg.models:make_resnet --input 1,3,224,224 \\
      --select 'layer*.*.relu_1' -o resnet.onnx
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``clouseau`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    A malformed argument exits with status 2 and one line on stderr while parsing; an error
    while the command runs returns 2 after one ``error:`` message; never a traceback.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help (0) or a malformed argument (2, already reported)
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    console = Console(highlight=False, soft_wrap=True, width=_width(args))
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return int(args.run(args, console))
    except (ClouseauError, OSError, ValueError, KeyError, TypeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        errors.print(f"[bold red]error:[/] {markup(message)}")
        return EXIT_USAGE
    except Exception as err:  # the user's model code may raise anything
        errors.print(
            f"[bold red]error:[/] {markup(type(err).__name__)}: {markup(one_line(str(err)))}"
        )
        return EXIT_USAGE
    except KeyboardInterrupt:
        errors.print("[bold red]interrupted[/]")
        return EXIT_INTERRUPTED


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

    show = sub.add_parser(
        "show",
        help="print a capture as a module tree",
        description="Print a capture as a tree of modules with shapes, dtypes and statistics; NaN and Inf are flagged.",
    )
    show.add_argument(
        "path",
        type=types.existing_path,
        help="capture directory (or one of its .safetensors files)",
    )
    show.add_argument(
        "--select",
        action="append",
        type=types.glob,
        metavar="GLOB",
        help="only points matching GLOB (repeatable; '!GLOB' excludes)",
    )
    show.add_argument("--stats", action="store_true", help="add mean, std, min and max")
    show.add_argument(
        "--values", action="store_true", help="print the leading values of each array"
    )
    show.add_argument(
        "--call", type=types.count(), metavar="K", help="only call K (default: every call)"
    )
    _add_width(show)
    show.set_defaults(run=_cmd_show)

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
    _add_width(d)
    d.set_defaults(run=_cmd_diff)

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
    dr.set_defaults(run=_cmd_draw)

    _add_explore(sub)

    ex = sub.add_parser("export-onnx", help="export a model to ONNX with activations as outputs",
                        description=_EXPORT_HELP.format(dtypes=", ".join(types.DTYPES)), formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ex.add_argument(
        "model", type=types.model_spec, metavar="MODEL", help="MODULE:ATTR factory spec (see above)"
    )
    ex.add_argument(
        "--input",
        action="append",
        type=types.input_spec,
        required=True,
        metavar="SHAPE[:DTYPE]",
        help="shape of one input (repeatable)",
    )
    ex.add_argument(
        "-o",
        "--output",
        type=types.onnx_output,
        default="model.onnx",
        help="the .onnx file (default model.onnx)",
    )
    ex.add_argument(
        "--select",
        action="append",
        type=types.glob,
        metavar="GLOB",
        help="activations to export as outputs (repeatable)",
    )
    ex.add_argument("--seed", type=types.seed, default=0, help="seed of the random example inputs")
    ex.set_defaults(run=cmd_export)
    return parser


def _add_width(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--width",
        type=types.width,
        metavar="N",
        help="wrap output at N columns (default: the terminal's width; unlimited in a pipe)",
    )


# -- show -----------------------------------------------------------------------------------
def _cmd_show(args: argparse.Namespace, console: Console) -> int:
    from clouseau.ir.selection import stored_selector
    from clouseau.store.array_stats import array_stats

    cap = _load(args.path)
    graph = cap.graph
    selected = stored_selector(args.select, graph) if args.select else None
    module_types = {m.path: m.type for m in graph.modules} if graph is not None else {}
    calls = cap.calls if args.call is None else (args.call,)
    if args.call is not None and args.call not in cap.calls:
        raise ClouseauError(
            f"call {args.call} is not in {args.path}; it holds calls {list(cap.calls)}"
        )
    where = f", graph {graph.name or '?'} ({graph.trace_kind.value})" if graph is not None else ""
    console.print(
        f"[bold]{markup(args.path)}[/]: {len(cap)} points, {len(cap.calls)} call(s){markup(where)}"
    )
    _print_state(cap, console)
    # Records grouped by call in one pass: show stays linear in the number of calls.
    by_call: dict[int, list[Any]] = {}
    for record in cap.records:
        by_call.setdefault(record.call, []).append(record)
    flagged: list[str] = []
    shown = 0
    for call in calls:
        root = (
            Tree(f"[bold]call {call}[/]")
            if len(calls) > 1
            else Tree(f"[bold]{markup(Path(args.path).name)}[/]")
        )
        branches: dict[str, Tree] = {"": root}
        seen: set[tuple[str, ...]] = set()
        for record in by_call.get(call, ()):
            if record.names in seen:
                continue
            seen.add(record.names)
            if selected is not None and not selected(record.names):
                continue
            array = cap.get(record.name, call=call)
            stats = array_stats(array)
            if not stats.finite:
                flagged.append(record.name)
            parent, parent_path = _branch(branches, record.name, module_types)
            leaf = parent.add(_point_text(record.names, parent_path, array, stats, args.stats))
            if args.values:
                leaf.add(Text(_values(array), style="dim"))
            shown += 1
        console.print(root)
    if args.select and not shown:
        raise ClouseauError(
            f"--select {' '.join(args.select)} matched no point of {args.path}; names: {', '.join(cap.names()[:8])}"
        )
    if flagged:
        console.print(
            f"[bold red]⚠ {len(flagged)} point(s) hold NaN or Inf; first: {markup(flagged[0])}[/]"
        )
    return EXIT_OK


def _load(path: str) -> Any:
    """``load(path)``; damaged files are listed by the caller, not warned about."""
    import warnings

    from clouseau.store import DamagedCaptureWarning, load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedCaptureWarning)
        return load(path)


def _print_state(cap: Any, console: Console) -> None:
    """What is wrong with a capture: not closed, damaged files, partial and failed calls."""
    if not cap.closed:
        made = "?" if cap.calls_made is None else cap.calls_made
        whole = len(set(cap.calls) - set(cap.partial_calls))
        console.print(
            f"[bold yellow]⚠ capture not closed: {made} calls made, {whole} on disk[/] "
            "[yellow](still being written, or the writer died: what is on disk loads)[/]"
        )
    for name, why in sorted(cap.damaged.items()):
        console.print(f"[bold red]⚠ damaged file {markup(name)} (skipped): {markup(why)}[/]")
    for call, reason in sorted(cap.partial_calls.items()):
        console.print(f"[yellow]call {call} is partial: {markup(reason)}[/]")
    for call, reason in sorted(cap.failed_calls.items()):
        console.print(
            f"[yellow]call {call} failed: {markup(reason)} (what it saved before is shown)[/]"
        )


def _branch(branches: dict[str, Tree], name: str, module_types: dict[str, str]) -> tuple[Tree, str]:
    """The tree node (and module path) holding ``name``, created with its ancestors."""
    parts = name.split(".")[:-1]
    path = ""
    for i in range(len(parts)):
        prefix = ".".join(parts[: i + 1])
        if module_types and prefix not in module_types and i < len(parts) - 1:
            continue  # not a module: fold this component into the next level's label
        if prefix not in branches:
            kind = module_types.get(prefix)
            label = f"[bold cyan]{markup(prefix)}[/]" + (
                f" [dim]({markup(kind)})[/]" if kind else ""
            )
            branches[prefix] = branches[path].add(label)
        path = prefix
    return branches[path], path


def _point_text(names: tuple[str, ...], parent: str, array: Any, stats: Any, full: bool) -> Text:
    name = names[0][len(parent) + 1 :] if parent else names[0]
    text = Text(printable(name), style="bold")
    if len(names) > 1:
        text.append(f" (aka {printable(', '.join(names[1:]))})", style="dim")
    dtype = str(array.dtype)
    text.append(f"  {dtype}[{','.join(map(str, array.shape))}]", style="green")
    if full:
        text.append(
            f"  mean {stats.mean:.4g}  std {stats.std:.4g}  min {stats.min:.4g}  max {stats.max:.4g}"
        )
    if stats.nan:
        text.append(f"  ⚠ NaN×{stats.nan}", style="bold white on red")
    if stats.inf:
        text.append(f"  ⚠ Inf×{stats.inf}", style="bold red")
    return text


def _values(array: Any) -> str:
    import numpy as np

    return np.array2string(
        np.asarray(array, dtype=np.float64) if array.dtype.kind == "V" else np.asarray(array),
        threshold=8,
        edgeitems=3,
        precision=4,
    )


# -- diff -----------------------------------------------------------------------------------
def _cmd_diff(args: argparse.Namespace, console: Console) -> int:
    from clouseau.store.diff import DEFAULT_ATOL, DEFAULT_RTOL, Status, diff

    sides = _load(args.a), _load(args.b)
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
    return EXIT_OK if result.ok else EXIT_DIFFERS


_STATUS_STYLE = {
    "close": "green", "differs": "bold red", "shape mismatch": "bold magenta",
    "missing in b": "yellow", "missing in a": "yellow",
}  # fmt: skip


def _shape(shape: tuple[int, ...] | None) -> str:
    return "" if shape is None else "[" + ",".join(map(str, shape)) + "]"


# -- draw -----------------------------------------------------------------------------------
def _cmd_draw(args: argparse.Namespace, console: Console) -> int:
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
    return EXIT_OK


# -- explore --------------------------------------------------------------------------------
def _add_explore(sub: Any) -> None:
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
    ex.set_defaults(run=_cmd_explore)


def _cmd_explore(args: argparse.Namespace, console: Console) -> int:
    from clouseau._explore import explore

    options = {k: v for k, v in (("rtol", args.rtol), ("atol", args.atol)) if v is not None}
    if options and args.other is None:
        raise ValueError("--rtol and --atol apply to a diff: give a second capture directory")
    source = args.path if args.other is None else (args.path, args.other)
    out = explore(source, args.output, depth=args.depth, **options)
    console.print(f"wrote {escape(str(out))}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
