"""The module state a trace bakes in, checked on every call.

A traced graph (fx or export) holds the model's plain Python attributes as constants:
``self.scale * x`` traced with ``scale = 2.0`` multiplies by 2.0 forever, and a graph
traced in eval mode skips dropout. Each call's key therefore holds, beside its inputs,
the training flag and every public plain attribute (bool, int, float, str, None) of every
module: changing one between calls selects (or traces) another graph, never a stale one.
Attributes held elsewhere (a ``config`` object, globals) are not covered: docs/torch.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from operator import itemgetter
from typing import Any

import torch

_PLAIN = (bool, int, float, str, type(None))


def _watched(module: torch.nn.Module) -> tuple[str, ...]:
    return tuple(
        k
        for k, v in vars(module).items()
        if k == "training" or (not k.startswith("_") and type(v) in _PLAIN)
    )


class ModuleState:
    """A cheap per-call reading of the attributes named when it was built."""

    __slots__ = ("_names", "_plan")

    def __init__(self, modules: Iterable[torch.nn.Module]) -> None:
        # One itemgetter per module over its instance dict: a C call each.
        plan: list[tuple[Callable[[dict[str, Any]], Any], dict[str, Any]]] = []
        names: list[tuple[str, ...]] = []
        for module in modules:
            watched = _watched(module)
            if watched:
                plan.append((itemgetter(*watched), vars(module)))
                names.append(watched)
        self._plan = tuple(plan)
        self._names = tuple(names)

    def key(self) -> Hashable:
        try:
            return tuple([get(d) for get, d in self._plan])
        except KeyError:  # an attribute deleted since: read what is left
            return tuple(
                tuple(d.get(k) for k in names)
                for (_, d), names in zip(self._plan, self._names, strict=True)
            )
