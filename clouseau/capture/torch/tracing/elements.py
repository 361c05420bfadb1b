"""The tensors inside a module output the traced graph holds only as a container.

A built-in module fx keeps as one call returns its value whole (``nn.LSTM``'s
``(out, (h, n))``): the graph has a node for the call and one per ``getitem`` the model
wrote, but the tensors inside a nested tuple (``h``, ``c``), or an element nothing reads,
have no node, so they would be no point. Which containers hold which tensors only a run
shows: the probe records the structure of every container-valued module output, and
:func:`expand` adds one node per tensor leaf (``pick(value, keys)``, right after the
container), named as docs/names.md names a module's elements (``<path>:1:0``), with the
probe's facts for it: its spec, a snapshot when the container's storage is written
later, a copy where it escapes, and in a live first run its value at birth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from clouseau.capture.torch.naming.points import clean_segment, element_keys
from clouseau.capture.torch.tracing.traced import NodeInfo, Traced
from clouseau.ir.graph import NodeKind, Spec

if TYPE_CHECKING:  # the probe records the leaves (leaves_of): no import cycle
    from clouseau.capture.torch.tracing.probe import FirstRun, Probe

TUPLE = ":tuple"  # the name of a call whose elements are the points (docs/names.md)


@dataclass(frozen=True)
class Leaf:
    """One tensor inside a container value: its keys from the container, its point-name
    suffix (``":1:0"``), its spec, and its value at birth (a live run only)."""

    keys: tuple[Any, ...]
    suffix: str
    spec: Spec
    value: torch.Tensor | None = None


def leaves_of(value: Any, spec_of: Any, keep: bool) -> tuple[Leaf, ...]:
    """The tensor leaves of a container ``value`` (``()`` for a tensor or a plain value)."""
    container = isinstance(value, tuple | list | Mapping) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )
    if not container:
        return ()
    found = []
    for keys, leaf in element_keys(value):
        if isinstance(leaf, torch.Tensor):
            suffix = "".join(f":{clean_segment(str(k))}" for k in keys)
            kept = leaf.detach().clone() if keep else None
            found.append(Leaf(keys, suffix, spec_of(leaf), kept))
    return tuple(found)


def pick(value: Any, keys: tuple[Any, ...]) -> Any:
    """The element of ``value`` at ``keys`` (indices, mapping keys, dataclass fields)."""
    for key in keys:
        indexed = isinstance(value, tuple | list | Mapping)
        value = value[key] if indexed else getattr(value, key)
    return value


def with_elements(
    traced: Traced, facts: Probe, first: FirstRun | None
) -> tuple[Traced, Probe, FirstRun | None]:
    """``traced`` with a node per tensor inside its container-valued module outputs, and
    the probe's facts (and the live first run's values) for each."""
    infos, origin = expand(traced, facts.containers)
    if not origin:
        return traced, facts, first
    specs = dict(facts.specs)
    later, escapes = set(facts.mutated_later), set(facts.escapes)
    for name, (container, leaf) in origin.items():
        specs[name] = leaf.spec
        # An element shares the container's storage: its facts are the container's.
        if container in facts.mutated_later:
            later.add(name)
        if container in facts.escapes:
            escapes.add(name)
        if first is not None and leaf.value is not None:
            first.values[name] = leaf.value
    facts = replace(facts, specs=specs, mutated_later=frozenset(later), escapes=frozenset(escapes))
    return replace(traced, infos={**traced.infos, **infos}), facts, first


def expand(
    traced: Traced, containers: Mapping[str, tuple[Leaf, ...]]
) -> tuple[dict[str, NodeInfo], dict[str, tuple[str, Leaf]]]:
    """Add a node per tensor leaf of each container-valued module output of ``traced``
    (``containers``: the probe's leaves by fx node name). Returns the new and renamed
    infos by fx node name, and for each new node its container's name and its leaf."""
    graph = traced.gm.graph
    taken = {n for info in traced.infos.values() for n in (info.name, *info.aliases)}
    infos: dict[str, NodeInfo] = {}
    origin: dict[str, tuple[str, Leaf]] = {}
    for node in list(graph.nodes):
        info = traced.infos.get(node.name)
        leaves = containers.get(node.name, ())
        if info is None or not info.module_output or not leaves:
            continue
        renamed, bases, whole = _bases(info, node.op == "call_module")
        taken.difference_update(whole)  # they move from the container to its first tensor
        anchor = node
        for position, leaf in enumerate(leaves):
            names = [b + leaf.suffix for b in bases] + (whole if position == 0 else [])
            names = [n for n in dict.fromkeys(names) if n not in taken]
            if not names:
                continue
            taken.update(names)
            with graph.inserting_after(anchor):
                anchor = graph.call_function(pick, (node, leaf.keys))
            anchor.meta = dict(node.meta)
            origin[anchor.name] = (node.name, leaf)
            infos[anchor.name] = NodeInfo(
                name=names[0], kind=NodeKind.OP, op="getitem", module=info.module,
                module_type=info.module_type, target="getitem", source=info.source,
                aliases=tuple(names[1:]), module_output=True,
            )  # fmt: skip
        infos[node.name] = renamed
    if origin:
        traced.gm.recompile()
    return infos, origin


def _bases(info: NodeInfo, call: bool) -> tuple[NodeInfo, list[str], list[str]]:
    """The container's info, the names its leaves' names extend, and the names that move
    to its first tensor: a module call's own name (the container is then
    ``<name>:tuple``) and every alias without a ``:``; a ``<name>:tuple`` call's leaves
    extend ``<name>``."""
    indexed = info.name.endswith(TUPLE)
    own = [info.name[: -len(TUPLE)]] if indexed else [info.name] if call else []
    whole = [a for a in (*own[indexed:], *info.aliases) if ":" not in a]
    kept = tuple(a for a in info.aliases if ":" in a)
    name = info.name + TUPLE if call and not indexed else info.name
    return replace(info, name=name, aliases=kept), [*own, *info.aliases], whole


def module_outputs(traced: Traced) -> frozenset[str]:
    """The fx names of the nodes that are module outputs: the probe records their leaves."""
    return frozenset(name for name, info in traced.infos.items() if info.module_output)
