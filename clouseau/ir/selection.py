"""The selection language: which points of a graph to capture.

``select`` is a glob, a sequence of globs (``"!glob"`` excludes), a callable
``Point -> bool``, a :class:`Selector`, or ``None`` (nothing). Selectors combine with
``&``, ``|`` and ``~``. An object with a ``for_graph(graph)`` method is asked for the
selection of each graph (for selections that depend on the whole graph). A glob with a dot matches the full name; a glob without a dot
matches the last name component or the op of the node (``"relu*"`` selects every ReLU,
module or function).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import Graph, Node, NodeKind, Point, Ref

Predicate = Callable[[Point], bool]

#: The ``point`` attr of a node that only a glob with a literal last component selects
#: (``"blocks.*.attn.pattern"``, ``"pattern"``; not ``"*"`` nor ``"blocks.0.attn.*"``).
NAMED = "named"


@dataclass(frozen=True)
class Selector:
    """A composable predicate on points; build with :meth:`glob`, :meth:`op`, ... or ``&|~``."""

    predicate: Predicate
    description: str

    def __call__(self, point: Point) -> bool:
        return bool(self.predicate(point))

    def __and__(self, other: SelectLike) -> Selector:
        o = as_selector(other)
        return Selector(lambda p: self(p) and o(p), f"({self.description} & {o.description})")

    def __or__(self, other: SelectLike) -> Selector:
        o = as_selector(other)
        return Selector(lambda p: self(p) or o(p), f"({self.description} | {o.description})")

    def __invert__(self) -> Selector:
        return Selector(lambda p: not self(p), f"~{self.description}")

    def __repr__(self) -> str:
        return f"Selector({self.description})"

    @staticmethod
    def glob(pattern: str) -> Selector:
        """Match a glob as docs/selection.md describes (see :func:`glob_matches`)."""
        _check_glob(pattern)
        return Selector(lambda p: glob_matches(pattern, p), repr(pattern))

    @staticmethod
    def op(*names: str) -> Selector:
        """Points whose node op is one of ``names`` (globs allowed): ``Selector.op("relu")``."""
        return Selector(lambda p: any(fnmatch.fnmatchcase(p.op, n) for n in names), f"op{names}")

    @staticmethod
    def in_module(path: str) -> Selector:
        """Points inside the module at ``path`` (the module's own output included)."""
        prefix = path + "."
        return Selector(
            lambda p: p.name == path or p.name.startswith(prefix) or p.module == path
            or p.module.startswith(prefix),
            f"in_module({path!r})",
        )  # fmt: skip

    @staticmethod
    def module_type(*types: str) -> Selector:
        """Points computed in (or as the output of) a module of one of these classes."""
        return Selector(lambda p: p.module_type in types, f"module_type{types}")

    @staticmethod
    def all() -> Selector:
        """Every point (as the glob ``"*"``)."""
        return Selector(lambda p: True, "all")


SelectLike = str | Sequence[str] | Callable[[Point], bool] | Selector | None


def glob_matches(pattern: str, point: Point) -> bool:
    if point.exact_only:  # state and non-tensor values: named, never swept up by a glob
        return pattern == point.name
    if point.node.attr("point") == NAMED and any(c in pattern.rsplit(".", 1)[-1] for c in "*?["):
        return False  # a computed point costs work: only a glob naming its leaf selects it
    if "." in pattern:
        return fnmatch.fnmatchcase(point.name, pattern)
    last = point.name.rsplit(".", 1)[-1]
    return fnmatch.fnmatchcase(last, pattern) or (
        not point.is_alias and fnmatch.fnmatchcase(point.op, pattern)
    )


def as_selector(select: SelectLike) -> Selector:
    """Normalise any accepted ``select`` value to a Selector."""
    if isinstance(select, Selector):
        return select
    if select is None or _is_empty_list(select):
        return Selector(lambda p: False, "nothing")
    if isinstance(select, str):
        return _from_globs((select,))
    if isinstance(select, Sequence) and all(isinstance(s, str) for s in select):
        return _from_globs(tuple(select))
    if callable(select):
        fn = select
        return Selector(lambda p: bool(fn(p)), getattr(fn, "__name__", "callable"))
    raise SelectionError(
        f"select must be a glob string, a list of globs, a callable Point -> bool, a Selector "
        f"or None; got {type(select).__name__}: {select!r}"
    )


def stored_selector(select: SelectLike, graph: Graph | None) -> Callable[[Sequence[str]], bool]:
    """Whether a stored value, given its names, is selected (``clouseau show --select``).

    A name that ``graph`` has is matched as its point, so the globs mean what they mean
    for ``instrument``; a gradient (``<point>.grad``) or a name in a capture without a
    graph is matched by its name alone (no op). A value is selected when one of its names
    is.
    """
    selector = as_selector(select)
    points = {p.name: p for p in graph.points} if graph is not None else {}

    def selected(names: Sequence[str]) -> bool:
        return any(selector(points.get(name) or _named(name)) for name in names)

    return selected


def _named(name: str) -> Point:
    # A name the graph does not have: an alias-like point (never matched by an op).
    return Point(name, Ref(name), Node(name, NodeKind.OP, ""), is_alias=True)


def check_select(select: SelectLike) -> None:
    """Raise SelectionError now for a select that no graph can accept (type, glob syntax)."""
    if not callable(getattr(select, "for_graph", None)):
        as_selector(select)


def _from_globs(patterns: tuple[str, ...]) -> Selector:
    include = tuple(Selector.glob(p) for p in patterns if not p.startswith("!"))
    exclude = tuple(Selector.glob(p[1:]) for p in patterns if p.startswith("!"))
    base = Selector.all() if not include else _any(include)
    return base & ~_any(exclude) if exclude else base


def _any(selectors: tuple[Selector, ...]) -> Selector:
    desc = " | ".join(s.description for s in selectors)
    return Selector(lambda p: any(s(p) for s in selectors), desc)


def _check_glob(pattern: str) -> None:
    if not isinstance(pattern, str) or not pattern or pattern.startswith("!"):
        raise SelectionError(
            f"invalid glob {pattern!r}: a glob is a non-empty string; '!' may only lead an item of select"
        )
    if pattern.count("[") != pattern.count("]"):
        raise SelectionError(f"invalid glob {pattern!r}: unbalanced '[' ']'")


def select_points(graph: Graph, select: SelectLike, *, strict: bool = True) -> tuple[Point, ...]:
    """The points of ``graph`` that ``select`` picks, in execution order.

    With ``strict``, a non-empty selection that picks nothing (or a glob in a list that
    matches no point) raises SelectionError naming the pattern and the closest names.
    """
    bind = getattr(select, "for_graph", None)
    if callable(bind):
        # A selection that depends on the whole graph (which value the model returns, say)
        # binds to it first: select.for_graph(graph) -> any other kind of select.
        return select_points(graph, bind(graph), strict=strict)
    selector = as_selector(select)
    chosen = tuple(p for p in graph.points if selector(p))
    if strict and select is not None and not _is_empty_list(select):
        for pattern in _positive_globs(select):
            if not any(glob_matches(pattern, p) for p in graph.points):
                raise SelectionError(_nothing_matched(repr(pattern), graph))
        if not chosen:
            raise SelectionError(_nothing_matched(selector.description, graph))
    return chosen


def _is_empty_list(select: SelectLike) -> bool:
    return isinstance(select, Sequence) and not isinstance(select, str) and len(select) == 0


def _positive_globs(select: SelectLike) -> Iterable[str]:
    if isinstance(select, str):
        select = (select,)
    if isinstance(select, Sequence):
        return [s for s in select if isinstance(s, str) and not s.startswith("!")]
    return []


def _nothing_matched(pattern: str, graph: Graph) -> str:
    names = graph.names()
    query = pattern.strip("'\"*?[]")
    candidates = list(names) + sorted(
        {n.rsplit(".", 1)[-1] for n in names} | {p.op for p in graph.points}
    )
    return (
        f"select {pattern} matched no point of {graph.name or 'the graph'} "
        f"({len(names)} points); closest names: {closest(query, candidates)}. "
        "List every name with clouseau.trace(model, *args).names()."
    )


def closest(query: str, candidates: Iterable[str], n: int = 5) -> str:
    """The ``n`` names most similar to ``query``, formatted for an error message."""
    pool = list(dict.fromkeys(candidates))
    found = difflib.get_close_matches(query, pool, n=n, cutoff=0.4)
    if len(found) < n:
        found += [c for c in pool if query and query in c and c not in found][: n - len(found)]
    return ", ".join(found) if found else "(none similar)"
