"""Lowering of the intervene and save_grad IR nodes to torch.fx.

An intervene node becomes an fx ``call_function`` right after the value's node, applying
its :class:`~clouseau.ir.actions.Action` (:func:`~clouseau.capture.torch.tracing.live.applier`,
which the first call applies too); every later user of the value is rewired to it. A save_grad node becomes a tap: an fx ``call_function`` that, when
the value requires grad, registers a tensor hook handing the gradient to the sink of the
call in progress. The hook is registered where the value is produced, so a later in-place
op (``ReLU(inplace=True)``) does not change which value the gradient is of.

A gradient of a computed point that stands in for a model value (a fused kernel's
``pattern`` or ``scores``: :func:`clouseau.ir.computed_interventions.grad_stand_ins`)
needs the backward pass to run through the point: every later reader of the kernel's
output reads :func:`grad_through` of it and of its decomposition, the kernel's output
forward (bitwise) and the decomposition's gradient backward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from clouseau.capture.torch.tracing.live import GradEmit
from clouseau.ir.graph import Node

_context = threading.local()


def grad_tap(node: Node, producer: str) -> Callable[[torch.Tensor], None]:
    """The fx call target of one save_grad node: registers the gradient hook, returns None."""
    names = node.names

    def clouseau_grad_tap(value: torch.Tensor) -> None:
        emit: GradEmit | None = getattr(_context, "emit", None)
        if emit is not None and isinstance(value, torch.Tensor) and value.requires_grad:
            value.register_hook(partial(_hook, emit, names, producer))

    return clouseau_grad_tap


def grad_through(value: torch.Tensor, decomposed: torch.Tensor) -> torch.Tensor:
    """``value`` forward, ``decomposed``'s gradient backward (``decomposed - itself`` is 0)."""
    return value.detach() + (decomposed - decomposed.detach())


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
