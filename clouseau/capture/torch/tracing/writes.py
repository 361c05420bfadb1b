"""Whether the ops between two nodes of an ATen graph write into a value, through a view.

torch.export's graph keeps the model's in-place writes through views as they ran
(``state[1][:, :, i] = h`` is a ``select`` then a ``copy_`` into it), so a tensor a module
returns may have been written since the node that created it: that node's value, taken
when it is produced, is not what the module returned. The ATen schemas say which
arguments an op writes (``Tensor(a!) self``) and which outputs are views of which
arguments (``Tensor(a) self -> Tensor(a)``); following them from the creating node to
the module's return finds the writes without running anything.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import torch.fx as fx


def written_between(value: fx.Node, end: fx.Node) -> bool:
    """Whether a node after ``value`` and before ``end`` writes into ``value`` or a view of it."""
    views = {value}
    node = value.next
    while node is not end and node.op != "output":
        if node.op == "call_function":
            if node.target is operator.getitem and node.args[0] in views:
                views.add(node)  # an element of a list of views (``split``, ``unbind``)
            for arg, info in _arguments(node):
                if arg not in views or info is None:
                    continue
                if info.is_write:
                    return True
                if _returns_view_of(node, info):
                    views.add(node)
        node = node.next
    return False


def _arguments(node: fx.Node) -> Iterator[tuple[fx.Node, Any]]:
    """Each tensor argument of ``node`` (list elements one by one) with its alias
    annotation; nothing for a call without an ATen schema."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args):
            given = node.args[index]
        elif argument.name in node.kwargs:
            given = node.kwargs[argument.name]
        else:
            continue
        for item in given if isinstance(given, list | tuple) else (given,):
            if isinstance(item, fx.Node):
                yield item, argument.alias_info


def _returns_view_of(node: fx.Node, info: Any) -> bool:
    """Whether an output of ``node`` shares the alias set of the argument annotated ``info``."""
    returns = node.target._schema.returns  # type: ignore[union-attr]
    return any(
        r.alias_info is not None and r.alias_info.before_set & info.before_set for r in returns
    )
