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
from clouseau.capture.torch._compat import (
    is_registered_node,
    register_cache_pytrees,
    tree_flatten,
)
from clouseau.capture.torch._sync import TRACE_LOCK
from clouseau.capture.torch.intervene import emitting_grads
from clouseau.capture.torch.lower import Lowered, SaveTarget, lower
from clouseau.capture.torch.naming import host_array
from clouseau.capture.torch.probe import FirstRun
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

    It is a drop-in for the model: an attribute it does not define is the model's
    (``fmodel.config``, ``fmodel.device``, ``fmodel.get_input_embeddings()``;
    ``fmodel.generate`` runs the model's own ``generate``, which does not capture), and
    ``state_dict()``/``load_state_dict()`` use the model's own keys (no ``model.``
    prefix), also when the instrumented model is itself a submodule.
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
        register_cache_pytrees(model)  # so that the first call's cache is keyed as later ones
        self._sink = sink
        self._select = select
        self._intervene = intervene
        self._grads = grads
        # Plain dict, not submodules: the lowered graphs hold references to the model's
        # own modules and weights, which must be registered (and counted) once.
        self._lowered: dict[Hashable, _Entry] = {}
        self._module_list: tuple[torch.nn.Module, ...] | None = None
        self.register_state_dict_post_hook(_model_keys)
        self.register_load_state_dict_pre_hook(_wrapper_keys)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: the per-call path never comes here.
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self.__dict__["_modules"].get("model")
            if model is None or name.startswith("__"):
                raise
            return getattr(model, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self.model)))

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
        entry = self._lowered.get(self._key(args, kwargs))
        if entry is None:
            entry, first = self._new_entry(args, kwargs, live=True)
            if first is not None:  # the trace ran this call: nothing runs twice
                return self._first_call(entry, first)
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

    def _first_call(self, entry: _Entry, first: FirstRun) -> Any:
        outputs = entry.lowered.traced.traced.from_outputs(first.output)
        if entry.plain:
            return outputs
        sink = self._sink
        call = sink.begin_call()
        try:
            values = [
                SavedValue(t.names, t.node, _first_array(first.values[t.key]))
                for t in entry.targets
            ]
            sink.put(call, entry.graph_id, values)
        except BaseException as error:
            sink.fail_call(call, error)
            raise
        sink.end_call(call)
        return outputs

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
        return self._new_entry(args, kwargs, live=False)[0]

    def _new_entry(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], *, live: bool
    ) -> tuple[_Entry, FirstRun | None]:
        """The entry of this call's signature, traced now if new; with ``live`` the trace
        runs the call itself, and only the thread that traced gets its :class:`FirstRun`."""
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
                        live=live,
                    )
                    graph_id = self._sink.add_graph(lowered.graph)
                    found = _Entry(self.model, lowered, graph_id, args, kwargs)
                    self._lowered[key] = found
                    return found, lowered.traced.first.take()
        return found, None

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._lowered.clear()
        self._module_list = None
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        extra = f", intervene={self._intervene!r}" if self._intervene else ""
        return f"select={self._select!r}{extra}" + (
            f", grads={self._grads!r}" if self._grads else ""
        )

    def __repr__(self) -> str:
        # One line: what it wraps and where the saves go, not the model's whole tree.
        where = getattr(self._sink, "path", None)
        to = f"to {str(where)!r}" if where is not None else "in memory"
        return f"InstrumentedModule({type(self.model).__name__}, {self.extra_repr()}, saving {to})"


_PREFIX = "model."


def _model_keys(module: torch.nn.Module, state: dict[str, Any], prefix: str, meta: Any) -> None:
    """``state_dict`` hook: the wrapped model's keys without the wrapper's ``model.``."""
    inner = prefix + _PREFIX
    for key in [k for k in state if k.startswith(prefix)]:
        value = state.pop(key)  # pop and put back every key: the order is kept
        state[prefix + key[len(inner) :] if key.startswith(inner) else key] = value


def _wrapper_keys(module: torch.nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
    """``load_state_dict`` pre-hook: the model's keys as the wrapper's submodule keys."""
    for key in [k for k in state if k.startswith(prefix) and not k.startswith(prefix + _PREFIX)]:
        state[prefix + _PREFIX + key[len(prefix) :]] = state.pop(key)


def _saved_values(
    targets: tuple[SaveTarget, ...], tensors: tuple[torch.Tensor, ...]
) -> list[SavedValue]:
    for target, t in zip(targets, tensors, strict=True):
        if isinstance(t, torch.Tensor) and t.is_meta:
            raise CaptureError(
                f"point {target.names[0]!r} is a meta tensor: it has a shape but no values "
                "to save. Run the model on a real device, or instrument it with select=None"
            )
    return [
        SavedValue(
            target.names,
            target.node,
            to_numpy(t, copy=target.host_copy) if isinstance(t, torch.Tensor) else host_array(t),
        )
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
    if is_registered_node(value):
        # A cache object is keyed by what it holds (it grows in place between calls).
        leaves, spec = tree_flatten(value)
        return ("tree", type(value), str(spec), tuple(map(_key, leaves)))
    try:
        hash(value)
    except TypeError:
        return ("repr", type(value).__name__, repr(value))
    return ("V", type(value), value)


_BITS = {
    torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
}


def _first_array(value: Any) -> np.ndarray:
    # The first run's copies are private to it: no second copy.
    return to_numpy(value, copy=False) if isinstance(value, torch.Tensor) else host_array(value)


def to_numpy(t: torch.Tensor, *, copy: bool = True) -> np.ndarray:
    """A host array with the dtype, shape and values of ``t`` (C-contiguous).

    With ``copy=False`` a CPU tensor's memory is shared, not copied: only for tensors
    nothing else can write to once the call returns (see ``SaveTarget.host_copy``).
    """
    if t.dtype in _BITS:  # numpy has no bfloat16 nor float8: through integer bits
        bits, dtype = _BITS[t.dtype]
        t = t.detach().resolve_conj().resolve_neg()
        array = t.cpu().view(bits).numpy().view(dtype)
    else:
        # detach().cpu().resolve_conj().resolve_neg().numpy() in one call (a third faster).
        array = t.numpy(force=True)
    return np.array(array, order="C", copy=True) if copy else np.asarray(array, order="C")
