"""``clouseau show``: a capture as a tree of modules with shapes, dtypes and statistics."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from clouseau.cli import args as types
from clouseau.cli.args import Exit, add_width
from clouseau.cli.text import markup, printable
from clouseau.ir.errors import ClouseauError


def add(sub: Any) -> None:
    """Register ``show`` on the subcommand parsers ``sub``."""
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
    add_width(show)
    show.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:
    """Run ``clouseau show``; the exit status."""
    from clouseau.ir.selection import stored_selector
    from clouseau.store.array_stats import array_stats

    cap = load_capture(args.path)
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
    return Exit.OK


def load_capture(path: str) -> Any:
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
