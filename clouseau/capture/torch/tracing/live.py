"""The first call with interventions or gradients, run once: what it applies as it runs.

The first call of a signature is the trace's probe run (its shapes, aliasing and
mutations decide the lowering), and it must be the user's call itself: a second run would
fire the user's forward hooks and Python side effects twice. With ``intervene`` or
``grads`` the graph that runs later differs from the traced one, so the probe applies the
same changes while it runs: which values get which action, and which get a gradient tap,
is decided on a provisional IR (names do not depend on shapes), and each action is bound
to its value's real shape when the value is produced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from clouseau.capture.torch.tracing.specs import spec_of
from clouseau.ir.actions import Action
from clouseau.ir.computed import is_computed
from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import DType, Graph, Ref, TensorSpec
from clouseau.ir.interventions import (
    GRAD_SUFFIX,
    Grads,
    Intervene,
    chosen_values,
    grad_points,
    point_names,
)
from clouseau.ir.selection import SelectLike

# Any tensor spec: which values a pattern picks depends on names and kinds, not shapes.
PROVISIONAL = TensorSpec((), DType.FLOAT32)

# What a gradient tap hands a gradient to: (names, producing node, gradient).
GradEmit = Callable[[tuple[str, ...], str, torch.Tensor], None]


class TorchOps:
    """The :class:`~clouseau.ir.actions.ArrayOps` of torch tensors."""

    def __init__(self) -> None:
        self._constants: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}

    def zeros_like(self, value: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(value)

    def clip(self, value: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
        return torch.clamp(value, lo, hi)

    def batch_mean(self, value: torch.Tensor) -> torch.Tensor:
        # contiguous() copies: a later in-place op must not write through an expanded view.
        return value.mean(dim=0, keepdim=True).expand_as(value).contiguous()

    def normal(self, value: torch.Tensor, seed: int) -> torch.Tensor:
        generator = torch.Generator(device=value.device)
        generator.manual_seed(seed)
        return torch.randn(value.shape, generator=generator, device=value.device, dtype=value.dtype)

    def constant(self, array: Any, like: torch.Tensor) -> torch.Tensor:
        key = (id(array), like.device, like.dtype)
        tensor = self._constants.get(key)
        if tensor is None:
            source = (
                array if isinstance(array, torch.Tensor) else torch.as_tensor(np.asarray(array))
            )
            tensor = source.detach().to(device=like.device, dtype=like.dtype)
            self._constants[key] = tensor
        # A copy, so that a later in-place op changes neither the cache nor the capture.
        return tensor.expand_as(like).clone()


def applier(action: Action) -> Callable[[torch.Tensor], torch.Tensor]:
    """How ``action`` applies to a tensor: the fx call target of one intervene node
    (``lowering/intervene.py``), and what the first call applies as it runs."""
    ops = TorchOps()

    def clouseau_intervene(value: torch.Tensor) -> torch.Tensor:
        return action.apply(value, ops)

    return clouseau_intervene


@dataclass
class GradCell:
    """Where the first call's gradient taps send gradients: set once the call has its
    number in the sink (backward runs after the forward returns)."""

    emit: GradEmit | None = None

    def __call__(self, names: tuple[str, ...], producer: str, grad: torch.Tensor) -> None:
        if self.emit is not None:
            self.emit(names, producer, grad)


@dataclass(frozen=True, eq=False)
class LivePlan:
    """Per fx node name: the action to apply, the gradient tap to register."""

    actions: Mapping[str, tuple[tuple[str, ...], Action]]
    taps: Mapping[str, tuple[tuple[str, ...], str]]
    grads: GradCell = field(default_factory=GradCell)

    def apply(self, key: str, value: Any) -> Any:
        """``value`` (fx node ``key``'s output) as the lowered graph would hand it on."""
        found = self.actions.get(key)
        if found is not None and isinstance(value, torch.Tensor):
            names, action = found
            spec = spec_of(value)
            assert isinstance(spec, TensorSpec)
            value = applier(action.bind(names, spec))(value)
        tap = self.taps.get(key)
        if tap is not None and isinstance(value, torch.Tensor) and value.requires_grad:
            value.register_hook(partial(_hook, self.grads, *tap))
        return value


def _hook(cell: GradCell, names: tuple[str, ...], producer: str, grad: torch.Tensor) -> None:
    cell(names, producer, grad)  # returns None: the gradient itself is left unchanged


def live_plan(
    graph: Graph,
    select: SelectLike,
    intervene: Intervene | None,
    grads: Grads,
) -> LivePlan:
    """The plan of ``graph`` (the provisional IR: every value :data:`PROVISIONAL`)."""
    keys = {node.name: node.key for node in graph.nodes}
    every = point_names(graph)
    chosen = chosen_values(graph, intervene or {})
    if any(is_computed(graph.node(ref.node)) for ref in chosen):
        # A computed pattern is intervened on by replacing its kernel, which the probe
        # cannot do as it runs: it probes on copies, and the call runs instrumented.
        raise SelectionError("an intervention on a computed point")
    actions = {keys[ref.node]: (every[ref], action) for ref, action in chosen.items()}
    by_ref: dict[Ref, list[str]] = {}
    for point in grad_points(graph, select, grads):
        if is_computed(graph.node(point.ref.node)):
            # Its gradient runs through the kernel's decomposition: the call runs instrumented.
            raise SelectionError("a gradient of a computed point")
        by_ref.setdefault(point.ref, []).append(point.name + GRAD_SUFFIX)
    taps = {keys[ref.node]: (tuple(names), ref.node) for ref, names in by_ref.items()}
    return LivePlan(actions, taps)
