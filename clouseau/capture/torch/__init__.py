"""The PyTorch frontend: trace an ``nn.Module`` into the IR and lower instrumented graphs.

Tracing uses torch.fx with torchvision's node names (``layer1.0.relu_1``), a module path
always naming its module's output; a model fx cannot trace (shape-dependent control
flow, ``len``/asserts on shapes, ``**kwargs``, autocast/no_grad regions) falls back to
``torch.export`` and gets the same names from ``nn_module_stack`` and output marks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from clouseau.capture.torch.lowering.lower import Lowered, lower
from clouseau.capture.torch.module import InstrumentedModule
from clouseau.capture.torch.naming.points import torchvision_points
from clouseau.capture.torch.runtime.host import to_numpy
from clouseau.capture.torch.tracing.ir_build import trace_model
from clouseau.capture.torch.tracing.traced import mark_leaf
from clouseau.ir.graph import Graph
from clouseau.ir.selection import SelectLike, check_select
from clouseau.ir.sink import Sink

__all__ = [
    "FRONTEND",
    "InstrumentedModule",
    "Lowered",
    "TorchFrontend",
    "instrument",
    "lower",
    "mark_leaf",
    "to_numpy",
    "torchvision_points",
    "trace",
]


def trace(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Graph:
    """Trace ``model(*args, **kwargs)`` into a verified IR graph.

    Parameters
    ----------
    model
        The module to trace; it is left unchanged (no buffer update, no RNG advance).
    *args, **kwargs
        Example inputs. Non-tensor arguments are fixed at their values.

    Returns
    -------
    Graph
        Traced by ``TORCH_FX`` or, when fx fails, ``TORCH_EXPORT`` (meta ``fx_error``
        holds why fx failed).

    Raises
    ------
    TypeError
        ``model`` is not an ``nn.Module``.
    clouseau.TraceError
        Neither torch.fx nor torch.export can trace the model.
    """
    return trace_model(model, args, kwargs).graph


def instrument(
    model: torch.nn.Module,
    *,
    select: SelectLike = "*",
    sink: Sink,
    intervene: Mapping[Any, Any] | None = None,
    grads: Any = False,
) -> InstrumentedModule:
    """Wrap ``model`` so that every call hands the ``select``-ed activations to ``sink``.

    Parameters
    ----------
    model
        The module; the result shares its parameters and follows ``train()``/``eval()``.
    select
        What to save (see :mod:`clouseau.ir.selection`); ``None`` saves nothing. A
        selection that matches nothing raises SelectionError at the first trace.
    sink
        Where the saved values go (a store from :mod:`clouseau.store`).
    intervene
        ``{pattern: action}`` (see :mod:`clouseau.ir.actions`): the values that the rest
        of the model, and the saves, see changed.
    grads
        True (the points of ``select``) or a selection: save the gradient of each point
        as ``<name>.grad`` when the user runs backward (see docs/interventions.md).

    Returns
    -------
    InstrumentedModule
        Called like ``model``, returning equal outputs; ``.trace(*args)`` traces eagerly.
    """
    # An invalid glob or select type fails now, not at the model's first call.
    check_select(select)
    return FRONTEND.instrument(model, select=select, sink=sink, intervene=intervene, grads=grads)


class TorchFrontend:
    """The PyTorch frontend as a :class:`clouseau.capture.Frontend`."""

    name = "torch"

    def trace(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> Graph:
        return trace(model, *args, **kwargs)

    def instrument(
        self,
        model: torch.nn.Module,
        *,
        select: SelectLike,
        sink: Sink,
        intervene: Mapping[Any, Any] | None = None,
        grads: Any = False,
    ) -> InstrumentedModule:
        # select was checked by the caller (the public API, or instrument above).
        _check_module(model)
        return InstrumentedModule(model, select, sink, intervene=intervene, grads=grads)

    def lower(
        self,
        model: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        select: SelectLike,
    ) -> Lowered:
        return lower(model, args, kwargs, select)

    def children(self, node: torch.nn.Module) -> Iterator[tuple[str, Any]]:
        # A module path is the dotted attribute names of named_modules (docs/names.md).
        yield from node.named_children()

    def backend(
        self,
        select: SelectLike,
        sink: Sink,
        *,
        compiler: str | Callable[..., Any],
        intervene: Mapping[Any, Any] | None,
    ) -> Any:
        from clouseau.capture.torch.dynamic.backend import Backend

        return Backend(select, sink, compiler=compiler, intervene=intervene)

    def distributed_client(self) -> None:
        # torch.distributed is public API: clouseau.distributed reads it directly.
        return None


FRONTEND = TorchFrontend()


def _check_module(model: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"instrument() takes a torch.nn.Module, not a {type(model).__name__}")
