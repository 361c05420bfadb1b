"""The instrumented torch model: an ``nn.Module`` that runs the lowered graph and saves."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from functools import partial
from operator import attrgetter
from typing import Any

import ml_dtypes
import numpy as np
import torch

from clouseau.capture._session import CaptureSession
from clouseau.capture.torch._sync import TRACE_LOCK
from clouseau.capture.torch.intervene import emitting_grads
from clouseau.capture.torch.lower import Lowered, SaveTarget, lower
from clouseau.ir.actions import Action
from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.ir.interventions import Grads
from clouseau.ir.selection import SelectLike
from clouseau.ir.sink import SavedValue, Sink

_training = attrgetter("training")


class _Entry:
    """What a call of one signature needs, looked up once when it is lowered.

    ``run`` is the GraphModule's ``forward`` itself: its ``__call__`` (fx's error wrapper,
    nn.Module's hook checks) costs microseconds a call and serves no one, as users hook
    their own modules, which the graph still calls through their ``__call__``, and this
    module. ``inputs`` picks the GraphModule's inputs for this call shape (the key of an
    entry fixes the count of positional arguments and the keyword names).
    """

    __slots__ = ("grads", "graph_id", "inputs", "lowered", "outputs", "plain", "run", "targets")

    def __init__(
        self,
        model: torch.nn.Module,
        lowered: Lowered,
        graph_id: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        traced = lowered.traced.traced
        _direct_attributes(lowered.module, model)
        self.lowered = lowered
        self.graph_id = graph_id
        self.run: Callable[..., Any] = lowered.module.forward
        plan = getattr(traced.to_inputs, "plan", None)
        self.inputs: Callable[..., tuple[Any, ...]] = (
            plan(args, kwargs) if plan is not None else traced.to_inputs
        )
        self.outputs: Callable[[Any], Any] = lowered.outputs
        self.targets: tuple[SaveTarget, ...] = lowered.targets
        self.grads = bool(lowered.graph.grad_saves)
        # Nothing to save now or at backward: the call is the model's (interventions and
        # all), with no sink bookkeeping.
        self.plain = not (self.targets or self.grads)


def _direct_attributes(gm: torch.fx.GraphModule, model: torch.nn.Module) -> None:
    """Let the generated code reach the submodules and weights it reads in one lookup.

    ``self.layer1`` in generated code misses the instance ``__dict__`` (nn.Module keeps
    children in ``_modules``) and falls back to ``nn.Module.__getattr__``, a Python call:
    about 2 us per module call, up to 30% of a small-op model's forward, where an eager
    ``nn.Sequential`` iterates its children directly. Copying each reference into the
    ``__dict__`` of the GraphModule and of its own intermediate containers (plain
    ``nn.Module`` instances fx made to hold the paths) makes each step a dict hit. The
    user's modules are never touched, and ``_modules`` stays the registry.
    """
    users = {id(m) for m in model.modules()}
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        owner: Any = gm
        for atom in str(node.target).split("."):
            value = getattr(owner, atom)
            if owner is gm or (type(owner) is torch.nn.Module and id(owner) not in users):
                owner.__dict__[atom] = value
            owner = value


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
        self._lowered: dict[Hashable, _Entry] = {}
        self._module_list: tuple[torch.nn.Module, ...] | None = None

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """Trace and lower for this call signature now; returns the graph with its saves."""
        return self._entry(args, kwargs).lowered.graph

    def lowered(self, *args: Any, **kwargs: Any) -> Lowered:
        """The lowered GraphModule for this call signature (e.g. for an ONNX exporter)."""
        return self._entry(args, kwargs).lowered

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # While another thread traces, torch.fx has patched nn.Module.__call__ itself, so
        # even entering this module must wait for the trace to end. Defined here, this
        # __call__ is not the patched one.
        if not TRACE_LOCK.enter_shared():  # under torch.compile
            return super().__call__(*args, **kwargs)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            TRACE_LOCK.exit_shared()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        entry = self._lowered.get(self._key(args, kwargs)) or self._entry(args, kwargs)
        if entry.plain:  # the model, and only the model
            return entry.outputs(entry.run(*entry.inputs(args, kwargs)))
        return self._saving_call(entry, entry.inputs(args, kwargs))

    def _saving_call(self, entry: _Entry, inputs: tuple[Any, ...]) -> Any:
        sink = self._sink
        call = sink.begin_call()
        try:
            if entry.grads:
                # The taps register gradient hooks that put into this call.
                with emitting_grads(partial(self._put_grad, call, entry.graph_id)):
                    raw = entry.run(*inputs)
            else:
                raw = entry.run(*inputs)
            if entry.targets:
                sink.put(call, entry.graph_id, _saved_values(entry.targets, raw[1]))
        except BaseException as error:
            sink.fail_call(call, error)
            raise
        sink.end_call(call)
        return entry.outputs(raw)

    def _put_grad(
        self, call: int, graph_id: int, names: tuple[str, ...], node: str, grad: torch.Tensor
    ) -> None:
        self._sink.put(call, graph_id, [SavedValue(names, node, to_numpy(grad))])

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
        modules = self._module_list
        if modules is None:  # walking the module tree each call costs more
            modules = self._module_list = tuple(self.model.modules())
        kw = tuple(sorted((k, _key(v)) for k, v in kwargs.items())) if kwargs else ()
        return (tuple(map(_key, args)), kw, tuple(map(_training, modules)))

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Entry:
        key = self._key(args, kwargs)
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
                    graph_id = self._sink.add_graph(lowered.graph)
                    found = _Entry(self.model, lowered, graph_id, args, kwargs)
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


def _saved_values(
    targets: tuple[SaveTarget, ...], tensors: tuple[torch.Tensor, ...]
) -> list[SavedValue]:
    for target, t in zip(targets, tensors, strict=True):
        if t.is_meta:
            raise CaptureError(
                f"point {target.names[0]!r} is a meta tensor: it has a shape but no values "
                "to save. Run the model on a real device, or instrument it with select=None"
            )
    return [
        SavedValue(target.names, target.node, to_numpy(t, copy=target.host_copy))
        for target, t in zip(targets, tensors, strict=True)
    ]


def _key(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        # torch.Size is a tuple: hashable as it is.
        return ("T", value.shape, value.stride(), value.dtype, value.device)
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(map(_key, value)))
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
    if t.dtype is torch.bfloat16:  # numpy has no bfloat16: through int16 bits
        t = t.detach().resolve_conj().resolve_neg()
        array = t.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        # detach().cpu().resolve_conj().resolve_neg().numpy() in one call (a third faster).
        array = t.numpy(force=True)
    return np.array(array, order="C", copy=True) if copy else np.asarray(array, order="C")
