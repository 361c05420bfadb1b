"""Lowering of the intervene and save_grad IR nodes to torch.fx.

An intervene node becomes an fx ``call_function`` right after the value's node, applying
its :class:`~clouseau.ir.actions.Action` with :class:`TorchOps`; every later user of the
value is rewired to it. A save_grad node becomes a tap: an fx ``call_function`` that, when
the value requires grad, registers a tensor hook handing the gradient to the sink of the
call in progress. The hook is registered where the value is produced, so a later in-place
op (``ReLU(inplace=True)``) does not change which value the gradient is of.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch

from clouseau.ir.actions import Action
from clouseau.ir.graph import Node

GradEmit = Callable[[tuple[str, ...], str, torch.Tensor], None]

_context = threading.local()


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
    """The fx call target of one intervene node."""
    ops = TorchOps()

    def clouseau_intervene(value: torch.Tensor) -> torch.Tensor:
        return action.apply(value, ops)

    return clouseau_intervene


def grad_tap(node: Node, producer: str) -> Callable[[torch.Tensor], None]:
    """The fx call target of one save_grad node: registers the gradient hook, returns None."""
    names = node.names

    def clouseau_grad_tap(value: torch.Tensor) -> None:
        emit: GradEmit | None = getattr(_context, "emit", None)
        if emit is not None and isinstance(value, torch.Tensor) and value.requires_grad:
            value.register_hook(partial(_hook, emit, names, producer))

    return clouseau_grad_tap


def _hook(emit: GradEmit, names: tuple[str, ...], producer: str, grad: torch.Tensor) -> None:
    emit(names, producer, grad)  # returns None: the gradient itself is left unchanged


@contextmanager
def emitting_grads(emit: GradEmit | None) -> Any:
    """Route the gradient taps run inside the block to ``emit`` (per thread; nests)."""
    outer = getattr(_context, "emit", None)
    _context.emit = emit
    try:
        yield
    finally:
        _context.emit = outer
