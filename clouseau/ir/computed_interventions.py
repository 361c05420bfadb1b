"""Interventions on computed points: which model value an intervened point stands in for.

A computed point (:mod:`clouseau.ir.computed`) is computed beside the model and feeds
nothing in it. An intervention on one (an ``intervene`` node reading it, inserted by
:func:`~clouseau.ir.interventions.insert_interventions`) reaches the model only where the
point can *stand in* for a model value: that value is recomputed from the intervened
point by a program, and every reader of the value reads the program's result instead.
:func:`stand_ins` says, for each intervened computed point of a graph, what it stands in
for (a :class:`StandIn`); a frontend lowers each one the same way whatever the point:

1. lower ``program`` (a computed node) with the intervene node's value as its first input
   and the model's values of ``program.inputs[1:]`` as the rest, after all of them and
   after ``replaces``;
2. make every reader of ``replaces`` that comes after it read the program's result
   instead (ops, saves, the outputs): the model computes on the changed value;
3. optionally drop the nodes of ``drops`` that nothing reads any more (the fused kernel,
   the projection's matmul), so that they are not computed for nothing.

With ``replaces`` None the point is a view nothing in the model reads: the intervention
changes its saved value only, and a frontend has nothing to do beyond the intervene node.

What each computed point stands in for:

- a fused attention kernel's ``scores`` / ``pattern`` (attrs ``kernel``, ``attention``):
  the kernel's output, as ``softmax(scores) @ v`` / ``pattern @ v``
  (:func:`~clouseau.ir.computed_attention.decomposition`);
- ``blocks.{i}.attn.head_out`` (attrs ``view="head_out"``, ``projection``): the output
  projection's output, as the sum over heads plus the bias
  (:func:`~clouseau.ir.computed_views.recomposition`); to rounding, not bitwise;
- ``q``/``k``/``v``/``z`` computed in the ``[batch, pos, head, d_head]`` layout the model
  never builds (attr ``view="heads_last"``): the model's ``[batch, head, pos, d_head]``
  value, transposed back (:func:`~clouseau.ir.computed_attention.heads_first`; exact);
- ``blocks.{i}.logit_lens`` (attr ``view="logit_lens"``): nothing (``replaces`` None);
- any other computed point: refused.

``grads=`` on a computed point (:func:`grad_stand_ins`) goes through the same stand-ins,
with the model's value kept forward: a frontend makes every later reader of ``replaces``
read ``out`` forward and the program's value backward (torch ``out.detach() + (d -
d.detach())``, JAX ``stop_gradient(out) + (d - stop_gradient(d))``), so the model's
outputs stay bitwise and the backward pass runs through the point. A view (the logit
lens, ``head_out``) is refused (:func:`view_grad_error`): the model never reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from clouseau.ir.computed import is_computed, program_of
from clouseau.ir.computed_attention import decomposition, heads_first
from clouseau.ir.computed_views import recomposition
from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import Graph, Node, NodeKind, Ref
from clouseau.ir.passes import producer_of


@dataclass(frozen=True)
class StandIn:
    """What an intervention on one computed point changes in the model.

    Attributes
    ----------
    point
        The intervened computed point (its node name).
    intervene
        The intervene node that changes it (its output is the changed value).
    replaces
        The model node whose value (output 0) the program recomputes; None: the point is
        a view nothing in the model reads, and the intervention changes its saved value.
    program
        A computed node: its first input is the intervene node, the rest model values;
        its value replaces ``replaces``' for every later reader. None with ``replaces``.
    drops
        Model nodes that only computed ``replaces``' value (the kernel, the projection's
        reshapes and matmul): a frontend may drop those nothing else reads.
    gradient
        A gradient's stand-in (:func:`grad_stand_ins`; ``intervene`` is then ``point``):
        the model reads ``replaces``' own value forward and the program's backward, and
        nothing is dropped.
    """

    point: str
    intervene: str
    replaces: str | None = None
    program: Node | None = None
    drops: tuple[str, ...] = ()
    gradient: bool = False


def stand_ins(graph: Graph) -> tuple[StandIn, ...]:
    """What each intervention on a computed point of ``graph`` changes, in graph order.

    Parameters
    ----------
    graph
        A graph with its intervene nodes (:func:`~clouseau.ir.interventions.rewrite`).

    Returns
    -------
    tuple[StandIn, ...]
        One per intervene node that reads a computed point (none: no such intervention).

    Raises
    ------
    SelectionError
        An intervention on a computed point that stands in for no model value and is no
        view the model never reads, one whose model
        value cannot be rebuilt, two on points standing in for one model value (a kernel's
        scores and pattern), or one on a computed point together with one on the value
        it stands in for (``head_out`` and the projection's output): each names the
        point(s) and what to intervene on instead.
    """
    found: list[StandIn] = []
    for node in graph.interventions:
        target = graph.node(node.inputs[0].node)
        if is_computed(target):
            found.append(_stand_in(graph, target, node.name))
    _check_disjoint(graph, found)
    return tuple(found)


def grad_stand_ins(graph: Graph, frontend: str) -> tuple[StandIn, ...]:
    """What each ``grads=`` on a computed point of ``graph`` needs in the model: one
    gradient :class:`StandIn` per model value (a kernel's scores and pattern share one,
    built from the pattern), none where an intervention already stands in for it.

    Parameters
    ----------
    graph
        A graph with its save_grad and intervene nodes.
    frontend
        The framework's name, for the error (``"torch"``, ``"JAX"``).

    Raises
    ------
    SelectionError
        A gradient of a view (:func:`view_grad_error`), or of a point whose model value
        cannot be rebuilt from it.
    """
    taken = {s.replaces for s in stand_ins(graph)}
    found: dict[str, StandIn] = {}
    for node in graph.grad_saves:
        target = graph.node(node.inputs[0].node)
        point = graph.node(target.inputs[0].node) if target.kind is NodeKind.INTERVENE else target
        if not is_computed(point):
            continue
        if point.attr("view") in _VIEWS:
            raise view_grad_error(point.name, frontend)
        if target is not point:
            continue  # intervened: its stand-in already makes the model read the point
        stand_in = replace(
            _stand_in(graph, point, point.name, "take the gradient of"), drops=(), gradient=True
        )
        if stand_in.replaces in taken:
            continue
        assert stand_in.replaces is not None
        if point.attr("attention") == "pattern" or stand_in.replaces not in found:
            found[stand_in.replaces] = stand_in  # the pattern: softmax(scores) reads both
    return tuple(found.values())


#: The computed views nothing in the model reads (no gradient reaches them).
_VIEWS = ("logit_lens", "head_out")


def view_grad_error(name: str, frontend: str) -> SelectionError:
    """The error of a gradient asked of a computed view ``name`` (in ``frontend``)."""
    return SelectionError(
        f"clouseau cannot take the gradient of {name!r} in {frontend}: it is a view computed "
        "beside the model (a logit lens, a per-head output), which the model never reads, "
        "so its gradient would be zero. Select the value it is computed from instead "
        "(blocks.*.resid_post, blocks.*.attn.z, blocks.*.attn_out, blocks.*.attn.pattern)."
    )


#: The computed points that stand in for a model value named by an attr: the attr, the
#: builder of the program that recomputes that value, and why it may not be buildable.
_REBUILT = (
    ("kernel", decomposition, ".decomposed",
     "its kernel's output is not the pattern applied to its values in a layout clouseau "
     "can rebuild. Load the model with attn_implementation='eager' to intervene on its own "
     "pattern."),
    ("projection", recomposition, ".recomposed",
     "clouseau cannot rebuild its output projection from it. Intervene on blocks.*.attn.z "
     "(a head's slice of it) or on blocks.*.attn_out."),
)  # fmt: skip


def _stand_in(graph: Graph, point: Node, intervene: str, doing: str = "intervene on") -> StandIn:
    value = Ref(intervene)
    if point.attr("view") == "logit_lens":
        return StandIn(point.name, intervene)
    for attr, build, suffix, why in _REBUILT:
        replaces = point.attr(attr)
        if isinstance(replaces, str):
            program = build(graph, point, value, point.name + suffix)
            if program is None:
                raise SelectionError(f"cannot {doing} {point.name!r}: {why}")
            # What the point replays (the projection) or the kernel: unread once replaced.
            drops = _replayed(point) or (replaces,)
            return StandIn(point.name, intervene, replaces, program, drops)
    program = heads_first(graph, point, value, f"{point.name}.heads_first")
    if program is not None:
        return StandIn(point.name, intervene, producer_of(graph, point.inputs[0]).node, program)
    raise SelectionError(
        f"cannot {doing} {point.name!r}: it is computed beside the model and stands "
        "in for no value the model reads, so changing it would change nothing the model "
        "computes. Intervene on the value it is computed from (blocks.*.attn.pattern, "
        "blocks.*.attn_out, blocks.*.resid_post)."
    )


def _replayed(point: Node) -> tuple[str, ...]:
    """The model nodes the point's program replays (those of its first replay)."""
    for step in program_of(point).nodes:
        nodes = step.attr("nodes")
        if step.kind is NodeKind.OP and isinstance(nodes, tuple):
            return tuple(str(n) for n in nodes)
    return ()


def _check_disjoint(graph: Graph, found: list[StandIn]) -> None:
    by_value: dict[str, str] = {}
    for stand_in in found:
        if stand_in.replaces is None:
            continue
        other = by_value.setdefault(stand_in.replaces, stand_in.point)
        if other != stand_in.point:
            raise SelectionError(
                f"cannot intervene on both {other!r} and {stand_in.point!r}: both stand in "
                f"for the same model value ({stand_in.replaces!r}; for a kernel's scores and "
                "pattern, the kernel replaced by its decomposition). Intervene on one of "
                "them (compose the changes in one clouseau.replace(fn) on the pattern)."
            )
    for node in graph.interventions:
        value = node.inputs[0].node
        for stand_in in found:
            if stand_in.replaces is not None and value in (stand_in.replaces, *stand_in.drops):
                names = node.attr("names")
                name = names[0] if isinstance(names, tuple) and names else value
                raise SelectionError(
                    f"cannot intervene on both {stand_in.point!r} and {name!r}: "
                    f"{stand_in.point!r} stands in for {name!r} (the model reads it "
                    "recomputed from the intervened point), so one change would be lost. "
                    f"Intervene on one of them (compose both in one clouseau.replace(fn) on "
                    f"{stand_in.point!r})."
                )
