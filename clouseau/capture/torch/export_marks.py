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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch.names import element_paths


@torch.library.custom_op("clouseau::module_output", mutates_args=())
def _module_output(x: torch.Tensor, call: int, element: int) -> torch.Tensor:
    return x.clone()


@_module_output.register_fake
def _(x: torch.Tensor, call: int, element: int) -> torch.Tensor:
    return torch.empty_like(x)


_module_output.register_autograd(lambda ctx, grad: (grad, None, None))
MARK = torch.ops.clouseau.module_output.default


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


@contextmanager
def marking(model: torch.nn.Module) -> Iterator[Marks]:
    """Mark the outputs of every submodule call of ``model`` while the block traces it."""
    marks = Marks()
    handles = [
        module.register_forward_hook(_hook(marks, path))
        for path, module in model.named_modules()
        if path
    ]
    try:
        yield marks
    finally:
        for handle in handles:
            handle.remove()


def _hook(marks: Marks, path: str) -> Any:
    def hook(module: torch.nn.Module, args: Any, out: Any) -> Any:
        call = len(marks.calls)
        marks.calls.append(path)
        suffixes: list[str] = []
        marks.elements.append(suffixes)

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
        return None

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


class _CannotRebuild(Exception):
    pass


def take_marks(graph: fx.Graph, marks: Marks) -> dict[fx.Node, list[Mark]]:
    """Remove the marks from ``graph``; for each marked node, the module outputs it is."""
    found: dict[fx.Node, list[Mark]] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not MARK:
            continue
        source, call, element = node.args
        assert isinstance(source, fx.Node) and isinstance(call, int) and isinstance(element, int)
        found.setdefault(source, []).append(Mark(call, marks.elements[call][element]))
        node.replace_all_uses_with(source)
        graph.erase_node(node)
    return found
