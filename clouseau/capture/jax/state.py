"""Carry a model's state updates through a trace: what a call writes, it writes again.

A Flax NNX module is a pytree whose ``nnx.Variable`` s (BatchNorm statistics, ``nnx.Rngs``
counters, a user's ``nnx.Variable``) the call may assign. Tracing runs the model on a
copy rebuilt from traced leaves, so those assignments would be lost: a capture must never
change what the model computes. Here the leaves a call assigned are found (by identity,
after the call), returned beside the outputs, and written back into the caller's
``Variable`` s, at the root of the model and at every marked submodule.

State a trace cannot carry (a plain Python attribute changed by the call, an array held
outside a ``Variable`` reassigned) is refused at trace time, naming the attribute.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax

from clouseau.capture.jax.naming import join, path_name
from clouseau.ir.errors import TraceError

# Attributes of NNX's own bookkeeping that change on a call without changing the model.
_PRIVATE = ("_pytree__", "_object__", "_graph_node__")


@dataclass(frozen=True)
class Snapshot:
    """A call's tree before the call: array leaves and plain attributes of its NNX parts.

    The tree is ``(model, args, kwargs)``; only its parts that hold NNX objects are looked
    at again after the call (an ``eqx.nn.State`` that the call used is invalid then).
    """

    sizes: tuple[int, ...]  # per part (model, each arg, each kwarg): its array leaves
    tracked: tuple[bool, ...]  # per part: it holds NNX objects
    arrays: tuple[Any, ...]  # the array leaves of the tracked parts
    attrs: tuple[tuple[str, Any], ...]  # ("path.attr", value) of plain attributes


def snapshot(tree: Any) -> Snapshot:
    """What :func:`changes` compares the tree with after the call."""
    parts = _parts(tree)
    sizes = tuple(len(_arrays(part)) for _, part in parts)
    tracked = tuple(_holds_nnx(part) for _, part in parts)
    arrays = tuple(
        x for (_, part), t in zip(parts, tracked, strict=True) if t for x in _arrays(part)
    )
    attrs = tuple(
        a
        for (name, part), t in zip(parts, tracked, strict=True)
        if t
        for a in _plain_attrs(part, name)
    )
    return Snapshot(sizes, tracked, arrays, attrs)


def changes(tree: Any, before: Snapshot, where: str = "") -> tuple[int, ...]:
    """Positions (among the tree's array leaves) of the leaves the call assigned.

    Raises
    ------
    TraceError
        If the call changed state a trace cannot carry: a plain attribute, the tree's
        structure, or an array outside an ``nnx.Variable``.
    """
    if not any(before.tracked):
        return ()
    tracked = [
        (name, part) for (name, part), t in zip(_parts(tree), before.tracked, strict=True) if t
    ]
    after = dict(a for name, part in tracked for a in _plain_attrs(part, name))
    for name, value in before.attrs:
        if name not in after or not _same(value, after.pop(name)):
            _refuse(join(where, name), "a Python attribute the call changed")
    if after:
        _refuse(join(where, next(iter(after))), "a Python attribute the call added")
    arrays = [x for _, part in tracked for x in _arrays(part)]
    if len(arrays) != len(before.arrays):
        _refuse(where or "the model", "its arrays (the call added or removed some)")
    holders = [h for name, part in tracked for h in _holders(part, name)]
    changed: list[int] = []
    for i, (a, b) in enumerate(zip(arrays, before.arrays, strict=True)):
        if a is not b:
            if holders[i][0] is None:
                _refuse(join(where, holders[i][1]), "an array outside an nnx.Variable")
            changed.append(i)
    return tuple(_positions(before, changed))


def refuse_shared(tree: Any, positions: Sequence[int]) -> None:
    """Refuse state assigned to an ``nnx.Variable`` that the tree holds at two paths.

    A pytree holds a shared object once per path: the trace runs on two copies, each
    assigned apart, where the model assigns one object twice.
    """
    if not positions:
        return
    holders = [h for name, part in _parts(tree) for h in _holders(part, name)]
    paths: dict[int, list[str]] = {}
    for variable, path in holders:
        if variable is not None:
            paths.setdefault(id(variable), []).append(path)
    for i in positions:
        variable, path = holders[i]
        others = [p for p in paths.get(id(variable), []) if p != path]
        if others:
            _refuse(
                path,
                f"an nnx.Variable the model also holds as {others[0]!r} (a pytree flattens a "
                "shared object once per path)",
                "hold the stateful module at one attribute, or give each path its own "
                "nnx.Variable.",
            )


def carried(tree: Any, positions: Sequence[int]) -> list[Any]:
    """The array leaves of ``tree`` at ``positions`` (the state a call assigned)."""
    if not positions:
        return []
    arrays = _arrays(tree)
    return [arrays[i] for i in positions]


def write_back(tree: Any, positions: Sequence[int], values: Sequence[Any]) -> None:
    """Assign ``values`` to the ``Variable`` s holding the array leaves at ``positions``."""
    if not positions:
        return
    holders = _holders(tree, "")
    for i, value in zip(positions, values, strict=True):
        variable = holders[i][0]
        if hasattr(variable, "set_value"):  # flax >= 0.12; the .value setter is deprecated
            variable.set_value(value)
        else:
            variable.value = value


def _positions(before: Snapshot, changed: list[int]) -> list[int]:
    """Positions among the tracked parts' arrays -> positions among all the tree's arrays."""
    offsets: list[int] = []
    start = 0
    for size, tracked in zip(before.sizes, before.tracked, strict=True):
        if tracked:
            offsets.extend(range(start, start + size))
        start += size
    return [offsets[i] for i in changed]


def _parts(tree: Any) -> list[tuple[str, Any]]:
    """The model, each argument and each keyword argument (in pytree order), named."""
    model, args, kwargs = tree
    named = [("", model), *((f"args.{i}", a) for i, a in enumerate(args))]
    return named + [(k, kwargs[k]) for k in sorted(kwargs)]


def _arrays(tree: Any) -> list[Any]:
    return [x for x in jax.tree_util.tree_leaves(tree) if eqx.is_array(x)]


def _holders(tree: Any, prefix: str) -> list[tuple[Any, str]]:
    """Per array leaf: the ``nnx.Variable`` holding it (None if none) and its path."""
    found: list[tuple[Any, str]] = []
    for keys, node in jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_variable)[0]:
        leaves = _arrays(node)
        holder = node if _is_variable(node) and len(leaves) == 1 else None
        found.extend((holder, join(prefix, path_name(keys))) for _ in leaves)
    return found


def _holds_nnx(tree: Any) -> bool:
    if sys.modules.get("flax.nnx") is None:
        return False
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: _is_variable(x) or _is_stateful(x))
    return any(_is_variable(x) or _is_stateful(x) for x in leaves) or _is_stateful(tree)


def _is_variable(x: Any) -> bool:
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(x, nnx.Variable)


def _plain_attrs(tree: Any, prefix: str) -> list[tuple[str, Any]]:
    """``("path.attr", value)`` of the plain (non-pytree) attributes of the tree's objects."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def walk(node: Any, path: str) -> None:
        if id(node) in seen or _is_variable(node):
            return
        seen.add(id(node))
        if _is_stateful(node):
            for attr, value in vars(node).items():
                if not attr.startswith(_PRIVATE) and _is_plain(value):
                    found.append((join(path, attr), _copied(value)))
        children = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
        for keys, child in children:
            if child is not node and not eqx.is_array(child):
                walk(child, join(path, path_name(keys)))

    walk(tree, prefix)
    return found


def _is_stateful(node: Any) -> bool:
    # Only NNX objects can be changed by a call; Equinox modules are frozen.
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(node, nnx.Pytree) and hasattr(node, "__dict__")


def _is_plain(value: Any) -> bool:
    if eqx.is_array(value) or _is_variable(value) or callable(value):
        return False
    leaves = jax.tree_util.tree_leaves(value, is_leaf=lambda x: x is not value)
    return not any(eqx.is_array(x) or _is_variable(x) or _is_stateful(x) for x in leaves)


def _copied(value: Any) -> Any:
    return copy.copy(value) if isinstance(value, list | dict | set) else value


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _refuse(name: str, what: str, fix: str = "") -> None:
    fix = fix or (
        "keep state that a call changes in an nnx.Variable (e.g. nnx.Variable(jnp.array(0)) "
        "for a counter, nnx.BatchStat for statistics), or in an eqx.nn.State passed in and "
        "returned."
    )
    raise TraceError(
        f"clouseau cannot carry the state {name!r} through a trace: it is {what}, which JAX "
        "tracing does not see, so the instrumented model would compute differently from the "
        f"model. Fix: {fix}"
    )
