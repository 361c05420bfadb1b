"""The instrumented torch model: an ``nn.Module`` that runs the lowered graph and saves."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from functools import partial
from typing import Any

import torch

from clouseau.capture._common import SinkCall
from clouseau.capture._session import CaptureSession
from clouseau.capture.torch._compat import (
    forward_hooks_of,
    forward_hooks_with_kwargs,
    forward_pre_hooks,
    module_dispatches,
    register_cache_pytrees,
)
from clouseau.capture.torch._sync import TRACE_LOCK
from clouseau.capture.torch.lowering.intervene import emitting_grads
from clouseau.capture.torch.lowering.lower import Lowered, lower
from clouseau.capture.torch.runtime import tiers
from clouseau.capture.torch.runtime.entry import Entry
from clouseau.capture.torch.runtime.guards import ModuleState
from clouseau.capture.torch.runtime.host import saved_values, to_numpy
from clouseau.capture.torch.runtime.reuse import keep, lookup, reuse_key
from clouseau.capture.torch.runtime.signature import (
    MAX_SIGNATURES,
    exact_key,
    structure_key,
)
from clouseau.capture.torch.tracing.export import LeafShapes, grad_mode, leaf_shapes
from clouseau.capture.torch.tracing.export_hooks import run_hooks
from clouseau.capture.torch.tracing.ir_build import UntraceableError
from clouseau.capture.torch.tracing.probe import FirstRun
from clouseau.ir.actions import Action
from clouseau.ir.errors import TraceError
from clouseau.ir.graph import Graph
from clouseau.ir.interventions import Grads
from clouseau.ir.selection import SelectLike
from clouseau.ir.sink import SavedValue, Sink

# Runs a function outside Dynamo (a graph break around it) under torch.compile.
_eager = torch.compiler.disable


class InstrumentedModule(torch.nn.Module, CaptureSession):
    """``model`` that also hands the selected activations of every call to a sink.

    The model is held as the submodule ``model`` (parameters shared, not copied). A graph
    is traced and lowered lazily per input *structure* (pytree, dtypes, ranks, devices,
    non-tensor arguments, the training flag of every module), not per shape: an fx graph
    takes any shape, an exported one every shape its guards allow (a call that breaks
    them exports again). ``traces`` counts the traces. ``.to()`` and friends drop the
    cache, as they may replace buffers the lowered graphs read.

    It is a drop-in for the model: an attribute it does not define is the model's
    (``fmodel.config``, ``fmodel.device``, ``fmodel.get_input_embeddings()``;
    ``fmodel.generate`` runs the model's own ``generate``, which does not capture), and
    ``state_dict()``/``load_state_dict()`` use the model's own keys (no ``model.``
    prefix), also when the instrumented model is itself a submodule.

    Attributes
    ----------
    traces : int
        How many graphs were traced (a new structure, a broken export guard, a region
        Dynamo compiled in the dynamic tier).
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
        # The model's own forward hooks (the same dict, hooks added later included): the
        # traced graph is its forward, so they run around it, as model.__call__ runs them.
        self._root_hooks = forward_hooks_of(model)
        # This module's own hooks (the live dicts, read by every call: looked up once).
        self._own_hooks = forward_hooks_of(self)
        self._own_pre_hooks = forward_pre_hooks(self)
        register_cache_pytrees(model)  # so that the first call's cache is keyed as later ones
        self._sink = sink
        self._select = select
        self._intervene = intervene
        self._grads = grads
        # Plain dict, not submodules: the lowered graphs hold references to the model's
        # own modules and weights, which must be registered (and counted) once.
        # Two levels: the exact call signature (shapes included) -> its entry, a dict hit
        # per call; on a miss, the entries of the call's structure, the first whose
        # guards accept the call.
        self._lowered: dict[Hashable, Any] = {}
        self._by_structure: dict[Hashable, list[Entry]] = {}
        self._shapes: dict[Hashable, list[LeafShapes]] = {}
        self._state: ModuleState | None = None
        self._traces = 0
        self._tier: Any = None  # the dynamic or hook tier, once fx and export failed
        self._hooks: Any = None  # the hook capture; False: the selection needs a trace
        self._warned_empty = False  # whether a call that saved nothing was reported
        self.register_state_dict_post_hook(_model_keys)
        self.register_load_state_dict_pre_hook(_wrapper_keys)

    @property
    def traces(self) -> int:
        """How many graphs were traced: one per input structure (and per broken export
        guard), plus, in the dynamic and hook tiers, one per region Dynamo compiled and
        one per sequence of module outputs the hooks met."""
        return self._traces + (self._tier.traces if self._tier is not None else 0)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: the per-call path never comes here.
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self.__dict__["_modules"].get("model")
            if model is None or name.startswith("__"):
                raise
            return getattr(model, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's own ``generate`` (Hugging Face), with every forward step captured.

        The prefill and each decode step are calls of the capture, in order; the tokens
        equal ``model.generate``'s (greedy, sampling under a seed, batches with left
        padding). See docs/generation.md for finding step k of sequence j.
        """
        from clouseau.capture.torch.runtime.generate import generate

        return generate(self, *args, **kwargs)

    def _hook_capture(self) -> Any:
        """The hook path's capture, or None when the call takes a traced tier."""
        if self._hooks is None:
            from clouseau.capture.torch.runtime.hooks import ModuleHooks, module_paths_selected

            paths = module_paths_selected(self.model, self._select)
            plain = not self._intervene and not self._grads
            first = tiers.first_tier(paths is not None, plain)
            self._hooks = (
                ModuleHooks(self.model, self._select, self._sink, paths)
                if first is tiers.Tier.HOOKS and paths
                else False
            )
        return self._hooks or None

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self.model)))

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """Trace and lower for this call signature now; returns the graph with its saves."""
        return self.lowered(*args, **kwargs).graph

    def lowered(self, *args: Any, **kwargs: Any) -> Lowered:
        """The lowered GraphModule for this call signature (e.g. for an ONNX exporter)."""
        entry = self._entry(args, kwargs)
        if entry.tier is not None:
            raise TraceError(
                f"{type(self.model).__name__} runs in the {self._tier.name} tier: it has no single "
                "graph to trace ahead of a call; call the model, then read the graph of each "
                "region in fmodel.captured.graphs"
            )
        return entry.lowered

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # While another thread traces, torch.fx has patched nn.Module.__call__ itself, so
        # even entering this module must wait for the trace to end. Defined here, this
        # __call__ is not the patched one.
        if not TRACE_LOCK.enter_shared():  # under torch.compile
            return self._compiled_call(args, kwargs)
        try:
            hooks = self._hooks
            if hooks and not (self._own_hooks or self._own_pre_hooks):
                out = hooks.run(args, kwargs)  # the hook path, past nn.Module's dispatch
                if not hooks.saved:
                    self._saved_nothing(tiers.Tier.HOOKS)
                return out
            if hooks is False and not module_dispatches(self):  # a traced tier, no hooks to run
                return self.forward(*args, **kwargs)
            return super().__call__(*args, **kwargs)
        finally:
            TRACE_LOCK.exit_shared()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hooks = self._hooks if self._hooks is not None else self._hook_capture()
        if hooks:  # module outputs only: forward hooks, no trace (runtime/hooks.py)
            out = hooks.run(args, kwargs)
            if not hooks.saved:
                self._saved_nothing(tiers.Tier.HOOKS)
            return out
        out = self._run(args, kwargs)
        # The graph holds the model's forward only, so its own forward hooks run around it;
        # not beside pre-hooks (FSDP2's fully_shard), which a graph cannot run in order.
        if self._root_hooks and self._tier is None and not forward_pre_hooks(self.model):
            model = self.model
            kw = set(forward_hooks_with_kwargs(model))
            return run_hooks(model, self._root_hooks, kw, args, kwargs, out)
        return out

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        entry = self._lowered.get(self._key(args, kwargs))
        if entry is None:
            entry, first = self._new_entry(args, kwargs, live=True)
            if first is not None:  # the trace ran this call: nothing runs twice
                return self._first_call(entry, first)
        if entry.plain:  # the model, and only the model
            return entry.outputs(entry.run(*entry.inputs(args, kwargs)))
        if entry.tier is not None:  # the dynamic or hook tier: it runs the whole call
            return entry.tier(args, kwargs)
        return self._saving_call(entry, entry.inputs(args, kwargs))

    def _compiled_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call inside ``torch.compile(fmodel)``: Dynamo compiles the lowered graph, and
        the bookkeeping (finding or tracing the entry, handing saves to the sink) runs
        eagerly between two graph breaks."""
        entry = _eager(self._entry)(args, kwargs)
        if entry.tier is not None or entry.grads:
            return _eager(self.forward)(*args, **kwargs)
        raw = entry.run(*entry.inputs(args, kwargs))
        if entry.targets:
            _eager(self._put_call)(entry, raw[1])
        return entry.outputs(raw)

    def _put_call(self, entry: Entry, saved: tuple[torch.Tensor, ...]) -> None:
        with SinkCall(self._sink) as call:
            values = saved_values(entry.targets, saved, entry.saves, plan=entry.host)
            self._sink.put(call, entry.graph_id, values)

    def _saving_call(self, entry: Entry, inputs: tuple[Any, ...]) -> Any:
        with SinkCall(self._sink) as call:
            if entry.grads:
                # The taps register gradient hooks that put into this call.
                with emitting_grads(partial(self._put_grad, call, entry.graph_id)):
                    raw = entry.run(*inputs)
            else:
                raw = entry.run(*inputs)
            if entry.unverified and entry.targets:
                entry.verify(inputs, raw, self.model)
            if entry.targets:
                values = saved_values(entry.targets, raw[1], entry.saves, plan=entry.host)
                self._sink.put(call, entry.graph_id, values)
                return entry.from_outputs(raw[0])
        return entry.outputs(raw)

    def _first_call(self, entry: Entry, first: FirstRun) -> Any:
        outputs = entry.lowered.traced.traced.from_outputs(first.output)
        if entry.plain:
            return outputs
        with SinkCall(self._sink) as call:
            if first.grads is not None:  # backward runs later: its taps put into this call
                first.grads.emit = partial(self._put_grad, call, entry.graph_id)
            values = entry.lowered.first_values(first)
            self._sink.put(
                call, entry.graph_id, saved_values(entry.targets, values, entry.saves, first=True)
            )
        return outputs

    def _put_grad(
        self, call: int, graph_id: int, names: tuple[str, ...], node: str, grad: torch.Tensor
    ) -> None:
        self._sink.put(call, graph_id, [SavedValue(names, node, to_numpy(grad))])

    def _key(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        of: Callable[[Any], Hashable] | None = None,
    ) -> Hashable:
        of = of or exact_key
        state = self._state
        if state is None:  # walking the module tree each call costs more
            state = self._state = ModuleState(self.model.modules())
        kw = tuple(sorted((k, of(v)) for k, v in kwargs.items())) if kwargs else ()
        # The modules' state too (training flags, plain attributes): a graph bakes it in.
        key = (tuple(map(of, args)), kw, state.key())
        # The exact key holds the grad and inference modes: an exported graph serves the
        # modes it traced under only (its ``accepts`` says so), an fx graph serves any.
        return (*key, grad_mode()) if of is exact_key else key

    def _entry(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._new_entry(args, kwargs, live=False)[0]

    def _new_entry(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], *, live: bool
    ) -> tuple[Any, FirstRun | None]:
        """The entry of this call's signature, traced now if new; with ``live`` the trace
        runs the call itself, and only the thread that traced gets its :class:`FirstRun`."""
        key = self._key(args, kwargs)
        found = self._lowered.get(key)
        if found is None:
            # Threads racing on a new signature: the first traces, the others reuse it.
            with TRACE_LOCK.exclusive():
                found = self._lowered.get(key)
                if found is None:
                    found, first = self._for_structure(args, kwargs, live)
                    if len(self._lowered) >= MAX_SIGNATURES:  # unbounded shapes: start over
                        self._lowered.clear()
                    self._lowered[key] = found
                    return found, first
        return found, None

    def _for_structure(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], live: bool
    ) -> tuple[Any, FirstRun | None]:
        """The entry of this call's structure whose guards accept it, traced if none does
        (with ``live``, the trace runs this call: its :class:`FirstRun` comes back)."""
        if self._tier is not None:
            return self._tier_entry, None
        structure = self._key(args, kwargs, structure_key)
        entries = self._by_structure.setdefault(structure, [])
        for entry in entries:
            if entry.accepts is None or entry.accepts(args, kwargs):
                entry.unverified = True
                return entry, None
        shapes_seen = self._shapes_seen(structure, args, kwargs, bool(entries))
        # A new instrumented model of a model already seen: the graph derived before.
        plain = not (self._intervene or self._grads)
        reuse = reuse_key(self.model, self._key(args, kwargs), self._select, plain, bool(entries))
        kept = lookup(reuse, self.model)
        if kept is not None:
            return self._add_entry(kept, args, kwargs, entries), None
        try:
            lowered = lower(
                self.model,
                args,
                kwargs,
                self._select,
                intervene=self._intervene,
                grads=self._grads,
                live=live,
                shapes_seen=shapes_seen,
            )
        except UntraceableError as error:
            from clouseau.capture.torch.dynamic.dynamo import DynamicTier, HookTier
            from clouseau.capture.torch.runtime.hooks import module_paths_selected

            paths = module_paths_selected(self.model, self._select, dotless=True)
            after = tiers.after_untraceable(bool(self._grads), bool(paths) and plain)
            if after is None:
                raise
            if after is tiers.Tier.HOOKS:
                assert paths is not None
                tier = HookTier(self.model, self._select, self._sink, paths, after)
            else:
                tier = DynamicTier(self.model, self._select, self._sink, self._intervene)
            return self._to_tier(tier, error.reasons), None
        self._traces += 1
        entry = self._add_entry(lowered, args, kwargs, entries)
        first = lowered.traced.first.take()
        keep(reuse, self.model, lowered)
        return entry, first

    def _shapes_seen(
        self, structure: Hashable, args: tuple[Any, ...], kwargs: dict[str, Any], seen: bool
    ) -> tuple[LeafShapes, ...]:
        """The shapes of the structure's earlier entries, which the export of a new shape
        compares with (:func:`~clouseau.capture.torch.tracing.export.trace_export`; empty:
        a static export), this call's added."""
        shapes = self._shapes.setdefault(structure, [])
        earlier = tuple(shapes)
        shapes.append(leaf_shapes(args, kwargs))
        dynamic = tiers.export_tier(seen) is tiers.Tier.EXPORT_DYNAMIC
        return earlier if dynamic else ()

    def _add_entry(
        self, lowered: Lowered, args: tuple[Any, ...], kwargs: dict[str, Any], entries: list[Any]
    ) -> Entry:
        entry = Entry(self.model, lowered, self._sink.add_graph(lowered.graph), args, kwargs)
        entries.append(entry)
        return entry

    def _to_tier(self, tier: Any, reasons: tuple[str, ...]) -> _TierEntry:
        tiers.warn_tier(self.model, tier.name, reasons)
        self._tier = tier
        self._tier_entry = _TierEntry(self._call_tier)
        return self._tier_entry

    def _call_tier(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from clouseau.capture.torch.dynamic.dynamo import DynamicTier, HookTier

        tier = self._tier
        out = tier(args, kwargs)
        if not tier.saved:
            self._saved_nothing(tier.tier)
        if isinstance(tier, DynamicTier):
            after = tiers.after_dynamic_call(dynamo_failed=tier.failure is not None)
            if after is tiers.Tier.HOOK_FALLBACK:  # this call ran with hooks already
                self._to_tier(HookTier(self.model, self._select, self._sink), (tier.failure,))
        return out

    def _saved_nothing(self, tier: tiers.Tier) -> None:
        """A call saved nothing: say so once, if the selection picks anything at all."""
        if not self._warned_empty and tiers.picks(self._select):
            self._warned_empty = True
            tiers.warn_empty(self.model, self._select, tier)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._lowered.clear()
        self._by_structure.clear()
        self._shapes.clear()
        self._state = None
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


class _TierEntry:
    """The entry of every call once the model runs in the dynamic or hook tier."""

    __slots__ = ("plain", "tier")

    def __init__(self, tier: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> None:
        self.plain = False
        self.tier = tier
