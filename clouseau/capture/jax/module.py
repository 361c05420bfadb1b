"""The instrumented model: the model's calling convention, plus a capture session.

An Equinox module (or any callable pytree) becomes an :class:`InstrumentedModule`, itself
an ``eqx.Module`` whose only pytree child is the model (so ``eqx.filter_jit``,
``jax.grad`` w.r.t. the model and ``eqx.partition`` see the model's array leaves) and
whose capture state is a static field. A plain function becomes an
:class:`InstrumentedFunction`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import equinox as eqx
import jax
import numpy as np

from clouseau.capture._common import SinkCall
from clouseau.capture._session import CaptureSession
from clouseau.capture.jax import _compat, receivers, state
from clouseau.capture.jax.build import build_graph
from clouseau.capture.jax.intervene import grad_emitting, intervention_rewrites
from clouseau.capture.jax.jaxpr_trace import Split, Traced, signature, split, trace_jaxpr
from clouseau.capture.jax.lower import Runnable, runnable
from clouseau.ir.actions import Action
from clouseau.ir.graph import Graph
from clouseau.ir.interventions import Grads, rewrite
from clouseau.ir.selection import SelectLike
from clouseau.ir.sink import Sink


@dataclass(frozen=True)
class _Entry:
    traced: Traced
    lowered: Runnable


@dataclass(frozen=True)
class _Plain:
    """The model of one input signature under ``jax.jit``, on its array leaves."""

    run: Any
    out: dict[str, Any]  # the output's split and the state positions, set when traced

    @staticmethod
    def of(parts: Split) -> _Plain:
        out: dict[str, Any] = {}

        def flat(*arrays: Any) -> tuple[Any, ...]:
            tree = parts.merge(arrays)
            before = state.snapshot(tree)
            model, args, kwargs = tree
            parts_out = split(model(*args, **kwargs))
            out["state"] = changed = state.changes(tree, before)
            out["out"] = parts_out.static()
            return (*parts_out.arrays, *state.carried(tree, changed))

        return _Plain(jax.jit(flat), out)

    def __call__(self, tree: Any, arrays: tuple[Any, ...]) -> Any:
        results = self.run(*arrays)
        n = len(results) - len(self.out["state"])
        state.write_back(tree, self.out["state"], results[n:])
        return self.out["out"].merge(results[:n])


class Core:
    """Capture state shared by every copy of one instrumented model (a static field)."""

    def __init__(
        self,
        sink: Sink,
        select: SelectLike,
        intervene: Mapping[Any, Action] | None = None,
        grads: Grads = False,
    ) -> None:
        self.sink = sink
        self.select = select
        self.intervene = intervene
        self.grads = grads
        self._lock = threading.Lock()
        self._entries: dict[tuple[Any, ...], _Entry] = {}
        self._plains: dict[tuple[Any, ...], _Plain] = {}

    def call(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        parts = split((model, args, kwargs))
        if self._untouched:
            if any(map(_compat.is_tracer, parts.arrays)):
                return model(*args, **kwargs)  # already inside the user's transformation
            # Called directly: compiled, as the saving path is, not op by op.
            return self._plain(parts)((model, args, kwargs), parts.arrays)
        entry = self.entry(parts, model, args, kwargs)
        arrays = parts.arrays
        if any(_compat.is_tracer(a) for a in arrays):
            outs = entry.lowered.emitting(*arrays)
        else:
            # The call is numbered before the model runs, so a run that raises is kept in
            # failed_calls (with why) and the calls keep the order they were made in.
            outs = self._collect(entry.lowered, arrays)
        return entry.traced.outputs((model, args, kwargs), outs)

    def _collect(self, lowered: Runnable, arrays: tuple[Any, ...]) -> list[Any]:
        plan = lowered.plan
        with SinkCall(self.sink) as call:
            if plan.streams:
                outs, saved = lowered.collect(np.int32(call), *arrays)
                jax.effects_barrier()  # the while loops' host callbacks have all run
            else:
                outs, saved = lowered.collect(*arrays)
            saved = lowered.unpack(saved)  # device_get, or the shards held here
            self.sink.put(call, lowered.graph_id, receivers.saved_values(plan, plan.top, saved, 0))
        return outs

    def _plain(self, parts: Split) -> _Plain:
        key = signature(parts)
        found = self._plains.get(key)
        if found is None:
            with self._lock:
                found = self._plains.setdefault(key, _Plain.of(parts))
        return found

    def entry(
        self, parts: Split, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _Entry:
        key = signature(parts)
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                traced = trace_jaxpr(model, args, kwargs)
                rewritten = rewrite(
                    build_graph(traced),
                    select=self.select,
                    intervene=self.intervene,
                    grads=self.grads,
                )
                graph = rewritten.graph
                graph_id = self.sink.add_graph(graph)
                rewrites, changes = intervention_rewrites(traced, graph, rewritten.actions)
                lowered = runnable(traced, graph, graph_id, self.sink, rewrites, changes)
                if graph.grad_saves:
                    emitting = grad_emitting(
                        traced, lowered.plan, graph, graph_id, self.sink, changes
                    )
                    lowered = replace(lowered, emitting=emitting)
                found = _Entry(traced, lowered)
                self._entries[key] = found
            return found

    @property
    def _untouched(self) -> bool:
        # Nothing to save, change or differentiate: the model runs as it is.
        return self.select is None and not self.intervene and not self.grads

    def graph(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Graph:
        if self._untouched:
            return build_graph(trace_jaxpr(model, args, kwargs))
        return self.entry(split((model, args, kwargs)), model, args, kwargs).lowered.graph


class _Session(CaptureSession):
    """Waits for pending host callbacks before the sink flushes or closes."""

    def flush(self) -> None:
        """Wait for pending saves, then write everything captured so far."""
        jax.effects_barrier()
        super().flush()

    def close(self) -> None:
        """Wait for pending saves, then flush and close the capture."""
        jax.effects_barrier()
        super().close()


class InstrumentedModule(eqx.Module, _Session):
    """An instrumented Equinox module (or callable pytree); call it like the model."""

    model: Any
    core: Core = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.core.call(self.model, args, kwargs)

    @property
    def _sink(self) -> Sink:  # type: ignore[override]
        return self.core.sink

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """The instrumented graph for these example arguments (traced now if needed)."""
        return self.core.graph(self.model, args, kwargs)


class InstrumentedFunction(_Session):
    """An instrumented JAX function; call it like the function."""

    def __init__(self, fn: Any, core: Core) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.core = core

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.core.call(self.fn, args, kwargs)

    @property
    def _sink(self) -> Sink:  # type: ignore[override]
        return self.core.sink

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """The instrumented graph for these example arguments (traced now if needed)."""
        return self.core.graph(self.fn, args, kwargs)

    def __repr__(self) -> str:
        return f"InstrumentedFunction({self.fn!r})"
