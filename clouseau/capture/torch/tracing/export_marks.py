"""Which torch.export node is which module call's output: marks put by forward hooks.

``nn_module_stack`` says which module an op ran in, not which value a module returned (an
``Identity`` or an eval ``DropPath`` runs no op at all, a tuple has several values). So
while torch.export traces, a forward hook on every submodule passes each tensor the module
returns through ``clouseau::module_output(x, call)``, an identity op that export records.
Afterwards each mark is removed (its users read ``x`` again) and remembered as "this node
is element ``suffix`` of module call ``call``": the graph that runs is the model's own.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch.naming.points import element_paths
from clouseau.capture.torch.tracing.export_hooks import Deferred, deferring, hook_nodes, take_inputs
from clouseau.capture.torch.tracing.fx import numerics_state
from clouseau.capture.torch.tracing.writes import written_between


@torch.library.custom_op("clouseau::module_output", mutates_args=())
def _module_output(x: torch.Tensor, call: int, element: int) -> torch.Tensor:
    return x.clone()


@_module_output.register_fake
def _(x: torch.Tensor, call: int, element: int) -> torch.Tensor:
    return torch.empty_like(x)


_module_output.register_autograd(lambda ctx, grad: (grad, None, None))
MARK = torch.ops.clouseau.module_output.default
RETURNED = "clouseau_returned"  # meta key of a view that holds a module's returned value


@dataclass(frozen=True)
class Mark:
    """Element ``suffix`` (``""``, ``":0"``, ``":logits"``) of call ``call``."""

    call: int
    suffix: str


@dataclass
class Marks:
    """The module calls seen while tracing (raw path of each, in call order)."""

    calls: list[str] = field(default_factory=list)
    elements: list[list[str]] = field(default_factory=list)
    untraceable: dict[str, str] = field(default_factory=dict)  # path -> output type
    deferred: Deferred | None = None  # the user's forward hooks, run in the graph


@contextmanager
def marking(model: torch.nn.Module) -> Iterator[Marks]:
    """Mark the outputs of every submodule call of ``model`` while the block traces it."""
    marks = Marks()
    with deferring(model, numerics_state) as deferred:
        marks.deferred = deferred
        inference = torch.is_inference_mode_enabled()
        handles = [
            module.register_forward_hook(_hook(marks, path, inference), with_kwargs=True)
            for path, module in model.named_modules()
            if path
        ]
        try:
            yield marks
        finally:
            for handle in handles:
                handle.remove()


class InferenceModeError(RuntimeError):
    """``forward`` enters or leaves inference mode, which torch.export does not record."""


def _hook(marks: Marks, path: str, inference: bool) -> Any:
    def hook(module: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> Any:
        if torch.is_inference_mode_enabled() != inference:
            # Its outputs would be plain tensors (with grads) in the graph: a tier that
            # runs forward itself reproduces the block.
            raise InferenceModeError(
                f"{path} runs in a `torch.inference_mode()` block of forward, which "
                "torch.export does not record"
            )
        call = len(marks.calls)
        marks.calls.append(path)
        suffixes: list[str] = []
        marks.elements.append(suffixes)
        given = out
        if marks.deferred is not None and module in marks.deferred.hooks:
            out = marks.deferred.take(module, call, out, args, kwargs)

        def mark(value: Any, suffix: str) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            suffixes.append(suffix)
            return _module_output(value, call, len(suffixes) - 1)

        found = list(element_paths(out))
        if any(isinstance(v, torch.Tensor) for _, v in found):
            try:
                return _rebuild(out, iter([mark(v, s) for s, v in found]))
            except _CannotRebuild:
                suffixes.clear()
        if out is not None:
            marks.untraceable.setdefault(path, type(out).__name__)
        return out if out is not given else None

    return hook


def _rebuild(value: Any, leaves: Iterator[Any]) -> Any:
    """``value`` with its leaves (in :func:`element_paths` order) replaced from ``leaves``."""
    if isinstance(value, Mapping):
        if not isinstance(value, dict):
            raise _CannotRebuild
        for key in list(value.keys()):
            value[key] = _rebuild(value[key], leaves)  # a ModelOutput updates its field too
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            object.__setattr__(value, f.name, _rebuild(getattr(value, f.name), leaves))
        return value
    if isinstance(value, tuple | list):
        items = [_rebuild(v, leaves) for v in value]
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return next(leaves)


def _return_too(
    node: fx.Node, region: fx.GraphModule, output: fx.Node, returned: Any, dropped: list[fx.Node]
) -> None:
    """Make ``region`` also return ``dropped``, each read by a new ``getitem`` of ``node``."""
    output.args = ((*returned, *dropped),)
    region.recompile()
    anchor = node
    for index, value in enumerate(dropped, start=len(returned)):
        with node.graph.inserting_after(anchor):
            anchor = node.graph.call_function(operator.getitem, (node, index))
        anchor.meta = dict(value.meta)  # its module stack names it inside its module


def _repair_users(graph: fx.Graph) -> None:
    """Make every node's ``users`` list the nodes that read it: export can leave a node's
    ``users`` short (seen around a ``no_grad`` region), and ``replace_all_uses_with``
    rewires only the users it lists."""
    for node in graph.nodes:
        for source in node.all_input_nodes:
            source.users.setdefault(node, None)


class _CannotRebuild(Exception):
    pass


def take_marks(
    gm: fx.GraphModule, marks: Marks, weights: frozenset[str] = frozenset()
) -> dict[fx.Node, list[Mark]]:
    """Remove the marks from ``gm``; for each marked node, the module outputs it is.
    ``weights``: the placeholders of ``gm`` that are parameters, buffers or constants.

    A mark inside a region export keeps as a submodule (``torch.autocast``, ``no_grad``)
    is removed there too, and passed on to the ``getitem`` that takes the value out; a
    marked value the region does not return (export dropped it: nothing outside used it)
    becomes an extra output of the region, so that every module call stays a point.
    """
    _repair_users(gm.graph)
    found: dict[fx.Node, list[Mark]] = {}
    inputs = take_inputs(gm.graph)
    removed: dict[fx.Node, fx.Node] = {}  # an input may be a module's (removed) mark
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is MARK:
            source, call, element = node.args
            assert isinstance(source, fx.Node) and isinstance(call, int)
            assert isinstance(element, int)
            point = _returned(gm.graph, source, node, weights)
            found.setdefault(point, []).append(Mark(call, marks.elements[call][element]))
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
            removed[node] = source
        elif node.op == "call_function":
            for region in _regions(gm, node):
                _pass_on(node, region, take_marks(region, marks), found)
    if marks.deferred is not None and marks.deferred.calls:
        for nodes in inputs.values():
            for index, node in nodes.items():
                while node in removed:
                    node = removed[node]
                nodes[index] = node
        _run_user_hooks(gm.graph, marks.deferred, inputs, found)
    gm.recompile()
    return found


def _run_user_hooks(
    graph: fx.Graph,
    deferred: Deferred,
    inputs: dict[int, dict[int, fx.Node]],
    found: dict[fx.Node, list[Mark]],
) -> None:
    """Put the nodes running deferred user hooks in; the marks of the hooked call and of
    the calls that returned its value (its parents) move to the hooks' result."""
    outputs = {m.call: node for node, ms in found.items() for m in ms if not m.suffix}
    placed = hook_nodes(graph, deferred, inputs, outputs.get)
    for call, (out, node) in placed.items():
        moving = [m for m in found.get(out, ()) if m.call >= call]
        found[out] = [m for m in found[out] if m.call < call]
        found.setdefault(node, []).extend(moving)


def _returned(graph: fx.Graph, source: fx.Node, mark: fx.Node, weights: frozenset[str]) -> fx.Node:
    """The node that is the value ``mark`` saw returned: ``source`` itself, or a view of it
    put at the mark (``RETURNED``) where ``source`` is no op's value as returned: a model's
    or a region's input (a placeholder is no point), or a tensor written through a view
    since it was made (RWKV's state, each layer writing its slice in place; the probe
    makes the view a snapshot where later layers write it too)."""
    given = source.op == "placeholder" and source.name not in weights
    if not given and not written_between(source, mark):
        return source
    with graph.inserting_before(mark):
        view = graph.call_function(torch.ops.aten.alias.default, (source,))
    view.meta = {**mark.meta, RETURNED: True}
    return view


def _regions(gm: fx.GraphModule, node: fx.Node) -> list[fx.GraphModule]:
    return [
        sub
        for arg in node.args
        if isinstance(arg, fx.Node) and arg.op == "get_attr"
        for sub in [getattr(gm, str(arg.target), None)]
        if isinstance(sub, fx.GraphModule)
    ]


def _pass_on(
    node: fx.Node,
    region: fx.GraphModule,
    inner: dict[fx.Node, list[Mark]],
    found: dict[fx.Node, list[Mark]],
) -> None:
    output = next(n for n in region.graph.nodes if n.op == "output")
    returned = output.args[0]
    if not isinstance(returned, tuple | list):
        return
    dropped = [value for value in inner if value not in returned]
    if dropped:
        _return_too(node, region, output, returned, dropped)
        returned = output.args[0]
    for user in node.users:
        if user.target is operator.getitem and isinstance(user.args[1], int):
            value = returned[user.args[1]]
            if isinstance(value, fx.Node) and value in inner:
                found.setdefault(user, []).extend(inner[value])
