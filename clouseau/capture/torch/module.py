"""The instrumented torch model: an ``nn.Module`` that runs the lowered graph and saves."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np
import torch

from clouseau.capture._session import CaptureSession
from clouseau.capture.torch._sync import TRACE_LOCK
from clouseau.capture.torch.intervene import emitting_grads
from clouseau.capture.torch.lower import Lowered, lower
from clouseau.ir.actions import Action
from clouseau.ir.graph import Graph
from clouseau.ir.interventions import Grads
from clouseau.ir.selection import SelectLike
from clouseau.ir.sink import SavedValue, Sink


class InstrumentedModule(torch.nn.Module, CaptureSession):
    """``model`` that also hands the selected activations of every call to a sink.

    The model is held as the submodule ``model`` (parameters shared, not copied). A graph
    is traced and lowered lazily per input signature (shapes, dtypes, devices, strides,
    non-tensor arguments, the training flag of every module) and cached; ``.to()`` and
    friends drop the cache, as they may replace buffers the lowered graphs read.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        select: SelectLike,
        sink: Sink,
        intervene: Mapping[Any, Action] | None = None,
        grads: Grads = False,
    ) -> None:
        super().__init__()
        self.model = model
        self._sink = sink
        self._select = select
        self._intervene = intervene
        self._grads = grads
        # Plain dict, not submodules: the lowered graphs hold references to the model's
        # own modules and weights, which must be registered (and counted) once.
        self._lowered: dict[Hashable, tuple[Lowered, int]] = {}
        self._module_list: tuple[torch.nn.Module, ...] | None = None

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """Trace and lower for this call signature now; returns the graph with its saves."""
        return self._lower_for(args, kwargs)[0].graph

    def lowered(self, *args: Any, **kwargs: Any) -> Lowered:
        """The lowered GraphModule for this call signature (e.g. for an ONNX exporter)."""
        return self._lower_for(args, kwargs)[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # While another thread traces, torch.fx has patched nn.Module.__call__ itself, so
        # even entering this module must wait for the trace to end. Defined here, this
        # __call__ is not the patched one.
        with TRACE_LOCK.shared():
            return super().__call__(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        lowered, graph_id = self._lower_for(args, kwargs)
        inputs = lowered.inputs(args, kwargs)
        if not (lowered.saves or lowered.graph.grad_saves):
            return lowered.outputs(lowered.module(*inputs))  # the model, and only the model
        call = self._sink.begin_call()
        try:
            # The taps (with grads=) register gradient hooks that put into this call.
            emit = partial(self._put_grad, call, graph_id) if lowered.graph.grad_saves else None
            with emitting_grads(emit):
                raw = lowered.module(*inputs)
            if lowered.saves:
                self._sink.put(call, graph_id, _saved_values(lowered, raw[1]))
        except BaseException as error:
            self._sink.fail_call(call, error)
            raise
        self._sink.end_call(call)
        return lowered.outputs(raw)

    def _put_grad(
        self, call: int, graph_id: int, names: tuple[str, ...], node: str, grad: torch.Tensor
    ) -> None:
        self._sink.put(call, graph_id, [SavedValue(names, node, to_numpy(grad))])

    def _lower_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Lowered, int]:
        if self._module_list is None:  # walking the module tree each call costs more
            self._module_list = tuple(self.model.modules())
        key = (_signature(args, kwargs), tuple(m.training for m in self._module_list))
        found = self._lowered.get(key)
        if found is None:
            # Threads racing on a new signature: the first traces, the others reuse it.
            with TRACE_LOCK.exclusive():
                found = self._lowered.get(key)
                if found is None:
                    lowered = lower(
                        self.model,
                        args,
                        kwargs,
                        self._select,
                        intervene=self._intervene,
                        grads=self._grads,
                    )
                    found = (lowered, self._sink.add_graph(lowered.graph))
                    self._lowered[key] = found
        return found

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._lowered.clear()
        self._module_list = None
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        extra = f", intervene={self._intervene!r}" if self._intervene else ""
        return f"select={self._select!r}{extra}" + (
            f", grads={self._grads!r}" if self._grads else ""
        )


def _saved_values(lowered: Lowered, tensors: tuple[torch.Tensor, ...]) -> list[SavedValue]:
    return [
        SavedValue(target.names, target.node, to_numpy(t, copy=target.host_copy))
        for target, t in zip(lowered.targets, tensors, strict=True)
    ]


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    return (tuple(_key(a) for a in args), tuple(sorted((k, _key(v)) for k, v in kwargs.items())))


def _key(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.dtype, value.device)
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return ("repr", type(value).__name__, repr(value))
    return ("V", type(value), value)


def to_numpy(t: torch.Tensor, *, copy: bool = True) -> np.ndarray:
    """A host array with the dtype, shape and values of ``t`` (C-contiguous).

    With ``copy=False`` a CPU tensor's memory is shared, not copied: only for tensors
    nothing else can write to once the call returns (see ``SaveTarget.host_copy``).
    """
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype is torch.bfloat16:
        array = t.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        array = t.cpu().numpy()
    return np.array(array, order="C", copy=True) if copy else np.asarray(array, order="C")
