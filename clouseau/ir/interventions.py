"""Rewrite passes for interventions and gradient saves, and the one entry point frontends call.

:func:`insert_interventions` puts an ``intervene`` node right after the producer of every
selected value and makes every later consumer (ops, saves, the output) read it, so the
model computes on, and saves, the changed value. :func:`insert_grad_saves` puts a
``save_grad`` node on selected values: the frontends lower it to a tap that hands the
gradient of the loss w.r.t. the value to the sink when the user differentiates.
:func:`rewrite` runs both and :func:`~clouseau.ir.passes.insert_saves`, in that order.

Where nothing is selected a pass returns its graph unchanged, so lowering it gives the
uninstrumented model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from clouseau.ir.actions import Action
from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import INSTRUMENTATION, Graph, Node, NodeKind, Point, Ref, TensorSpec
from clouseau.ir.passes import insert_saves
from clouseau.ir.selection import SelectLike, as_selector, select_points
from clouseau.ir.verify import verify

INTERVENE_PREFIX = "intervene."
SAVE_GRAD_PREFIX = "save_grad."
GRAD_SUFFIX = ".grad"

Intervene = Mapping[
    Any, Action
]  # SelectLike (hashable: a glob, tuple of globs, Selector) -> Action
Grads = bool | SelectLike


@dataclass(frozen=True)
class Rewritten:
    """An instrumented graph and the side table of its intervene nodes.

    Attributes
    ----------
    graph
        The verified graph with its intervene, save_grad and save nodes.
    actions
        The bound :class:`Action` of every intervene node, by node name: what the
        frontend applies (the IR holds only its description).
    """

    graph: Graph
    actions: Mapping[str, Action] = field(default_factory=lambda: MappingProxyType({}))

    def action(self, node: Node) -> Action:
        return self.actions[node.name]


def rewrite(
    graph: Graph,
    *,
    select: SelectLike,
    intervene: Intervene | None = None,
    grads: Grads = False,
    strict: bool = True,
) -> Rewritten:
    """Instrument ``graph``: interventions, then gradient saves, then saves.

    Parameters
    ----------
    graph
        A traced graph (no instrumentation yet).
    select
        The points to save (see :mod:`clouseau.ir.selection`).
    intervene
        ``{pattern: action}``; each pattern is anything ``select`` accepts that is
        hashable (a glob, a tuple of globs, a Selector).
    grads
        False/None: no gradients; True: the gradient of every point ``select`` picks;
        a selection: the gradients of the points it picks.
    strict
        A pattern that matches nothing raises SelectionError.

    Returns
    -------
    Rewritten
        The verified graph and the actions of its intervene nodes.
    """
    rewritten = insert_interventions(graph, intervene or {}, strict=strict)
    out = rewritten.graph
    out = insert_grad_saves(out, grad_points(out, select, grads, strict=strict))
    out = insert_saves(out, select, strict=strict)
    return replace(rewritten, graph=verify(out))


def grad_points(
    graph: Graph, select: SelectLike, grads: Grads, *, strict: bool = True
) -> tuple[Point, ...]:
    """The points whose gradients ``grads`` asks for (none for False/None)."""
    grad_select = _grad_selection(select, grads)
    if grad_select is None:
        return ()
    return select_points(graph, grad_select, strict=strict)


def _grad_selection(select: SelectLike, grads: Grads) -> SelectLike:
    if grads is True:
        return select
    if grads is False or grads is None:
        return None
    return grads


def insert_interventions(graph: Graph, intervene: Intervene, *, strict: bool = True) -> Rewritten:
    """Insert one intervene node per selected value and rewire its later consumers to it.

    Several names of one value (a node and the module output it is) give one intervene
    node; a value picked by two patterns with different actions is an error (which one
    would win is unclear).
    """
    chosen = chosen_values(graph, intervene, strict=strict)
    if not chosen:
        return Rewritten(graph)
    every = point_names(graph)
    actions: dict[str, Action] = {}
    nodes: list[Node] = []
    redirect: dict[Ref, Ref] = {}
    for node in graph.nodes:
        nodes.append(_rewired(node, redirect))
        if node.kind in INSTRUMENTATION:
            continue
        for index, spec in enumerate(node.outputs):
            action = chosen.get(Ref(node.name, index))
            if action is None or not isinstance(spec, TensorSpec):
                continue
            names = every[Ref(node.name, index)]
            new = intervene_node(node, index, names, action)
            actions[new.name] = action.bind(names, spec)
            redirect[Ref(node.name, index)] = Ref(new.name)
            nodes.append(new)
    return Rewritten(graph.with_nodes(tuple(nodes)), MappingProxyType(actions))


def chosen_values(graph: Graph, intervene: Intervene, *, strict: bool = True) -> dict[Ref, Action]:
    """The value each pattern of ``intervene`` picks, with its (unbound) action."""
    chosen: dict[Ref, tuple[Action, str]] = {}
    for pattern, action in intervene.items():
        if not isinstance(action, Action):
            raise TypeError(
                f"intervene={{{pattern!r}: ...}} takes an action such as clouseau.zero(), "
                f"clouseau.scale(k) or clouseau.replace(fn), not {type(action).__name__}"
            )
        for point in select_points(graph, pattern, strict=strict):
            other, where = chosen.setdefault(point.ref, (action, repr(pattern)))
            if other != action or other.payload is not action.payload:
                raise SelectionError(
                    f"{point.name!r} is picked by two intervene patterns ({where} and "
                    f"{pattern!r}); make the patterns disjoint, or compose the actions in "
                    "one clouseau.replace(fn)"
                )
    return {ref: action for ref, (action, _) in chosen.items()}


def point_names(graph: Graph) -> dict[Ref, tuple[str, ...]]:
    """Every name of each value (node name first): a capture to patch from may hold the
    value under any of them, not just the one a pattern hit."""
    every: dict[Ref, list[str]] = {}
    for point in graph.points:
        every.setdefault(point.ref, []).append(point.name)
    return {ref: tuple(names) for ref, names in every.items()}


def intervene_node(producer: Node, index: int, names: tuple[str, ...], action: Action) -> Node:
    """The intervene node of output ``index`` of ``producer``.

    It keeps the producer's module (a drawing puts it in the same cluster) but not its
    key: frontends find the value through its input.
    """
    return Node(
        name=INTERVENE_PREFIX + names[0],
        kind=NodeKind.INTERVENE,
        op="intervene",
        inputs=(Ref(producer.name, index),),
        outputs=(producer.outputs[index],),
        module=producer.module,
        module_type=producer.module_type,
        attrs=(("action", action.describe()), ("names", names)),
    )


def _rewired(node: Node, redirect: dict[Ref, Ref]) -> Node:
    if not redirect or not any(r in redirect for r in node.inputs):
        return node
    return replace(node, inputs=tuple(redirect.get(r, r) for r in node.inputs))


def insert_grad_saves(graph: Graph, points: tuple[Point, ...]) -> Graph:
    """Insert one save_grad node per selected value, right after the value the model uses.

    For an intervened value that is the intervene node's output (the gradient flows
    through the changed value). Its ``names`` are the point names with ``.grad``.
    """
    if not points:
        return graph
    by_ref: dict[Ref, list[str]] = {}
    for point in points:
        by_ref.setdefault(point.ref, []).append(point.name)
    intervened = {n.inputs[0] for n in graph.interventions}
    nodes: list[Node] = []
    for node in graph.nodes:
        nodes.append(node)
        if node.kind is NodeKind.INTERVENE:
            targets = [(node.inputs[0], Ref(node.name))]
        elif node.kind in INSTRUMENTATION or node.kind is NodeKind.OUTPUT:
            continue
        else:
            refs = (Ref(node.name, i) for i in range(len(node.outputs)))
            targets = [(r, r) for r in refs if r not in intervened]
        for point_ref, value in targets:
            names = by_ref.get(point_ref)
            if names:
                nodes.append(grad_save_node(value, tuple(names)))
    return graph.with_nodes(tuple(nodes))


def grad_save_node(ref: Ref, names: tuple[str, ...]) -> Node:
    grad_names = tuple(n + GRAD_SUFFIX for n in names)
    return Node(
        name=SAVE_GRAD_PREFIX + names[0],
        kind=NodeKind.SAVE_GRAD,
        op="save_grad",
        inputs=(ref,),
        attrs=(("names", grad_names),),
    )


def check_intervene(intervene: Any) -> Intervene | None:
    """Validate ``instrument(intervene=...)`` early, before any trace.

    Returns
    -------
    The mapping, or None when nothing is to be changed.
    """
    if intervene is None:
        return None
    if not isinstance(intervene, Mapping):
        raise TypeError(
            "intervene takes a dict {pattern: action}, e.g. {'relu*': clouseau.zero()}; "
            f"got {type(intervene).__name__}"
        )
    for pattern, action in intervene.items():
        if not callable(getattr(pattern, "for_graph", None)):  # bound per graph later
            as_selector(pattern)  # raises SelectionError on a malformed pattern
        if not isinstance(action, Action):
            raise TypeError(
                f"intervene[{pattern!r}] must be an action such as clouseau.zero(), not "
                f"{type(action).__name__}"
            )
    return intervene or None
