"""``clouseau.backend``: a ``torch.compile`` backend that saves activations.

``torch.compile(model, backend=clouseau.backend(select="relu*", path=".clouseau"))``
instruments every graph Dynamo hands the backend with the same rewrite pass as
:func:`clouseau.instrument`, then compiles the instrumented graph with another backend
(Inductor by default, or ``"aot_eager"``, ``"eager"``), so the compiled model saves what
the eager one would.

A compiled module is captured as the dynamic tier captures a model (:mod:`dynamic.dynamo`):
module outputs through :class:`~clouseau.capture.torch.runtime.hooks.ModuleHooks` (each
hooked module a graph break, its hook run eagerly on the real values), ops by the regions,
named from the model's root whatever frame Dynamo compiles (a graph break inside a
submodule compiles that submodule's frame on its own). The backend finds the model when
Dynamo starts compiling its first frame, before it traces it, so the hooks are there from
the first call on. Each call of the compiled model is one call of the capture, the runs of
all its graphs (graph breaks and all) included: the root's hooks delimit the calls; the
first call, found while it ran, ends when the model is called next (compiled or not) or
the capture is read (a submodule called on its own before that saves into it).
A compiled function (no module) saves what its regions compute, one call per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture._common import SinkCall
from clouseau.capture._session import CaptureSession
from clouseau.capture.torch._compat import (
    compiled_call,
    lookup_backend,
    on_compile_start,
    on_recompile_limit,
    recompile_limit,
    remove_compile_start,
    remove_recompile_limit,
)
from clouseau.capture.torch.dynamic.dynamo import InputPoints
from clouseau.capture.torch.dynamic.regions import Compiler, RegionCompiler
from clouseau.capture.torch.runtime.hooks import ModuleHooks, hooked_paths
from clouseau.capture.torch.runtime.tiers import warn_recompile_limit
from clouseau.ir.actions import Action
from clouseau.ir.graph import TraceKind
from clouseau.ir.selection import SelectLike
from clouseau.ir.sink import Sink


class Backend(CaptureSession):
    """A ``torch.compile`` backend that saves the selected activations to a sink.

    Use it as a context manager (or call ``close()``) to flush the capture; ``captured``
    is what it saved so far and ``traces`` counts the graphs it compiled.
    """

    def __init__(
        self,
        select: SelectLike,
        sink: Sink,
        *,
        compiler: str | Callable[..., Any] = "inductor",
        intervene: Mapping[Any, Action] | None = None,
    ) -> None:
        self._sink = sink
        self._select = select
        self._intervene = intervene
        self._compiler = compiler
        self._inner = lookup_backend(compiler) if compiler != "eager" else None
        # A compiled function (no module): its regions save everything, one call per call.
        self._regions = RegionCompiler(select, sink, intervene=intervene, compiler=self._inner)
        self._roots: dict[int, _Root] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # .root: the compiled module this thread runs
        self._started = on_compile_start(self._compile_starts)
        self._limited = on_recompile_limit(self._limit_reached)
        self._warned_limit = False  # whether a recompile limit hit was reported

    @property
    def traces(self) -> int:
        """How many region graphs the backend compiled."""
        return self._regions.traces + sum(r.regions.traces for r in self._roots.values())

    def _end_open(self) -> None:
        self._regions.end_open()
        for root in list(self._roots.values()):
            root.end()

    def flush(self) -> None:
        self._end_open()
        super().flush()

    def close(self) -> None:
        remove_compile_start(self._started)
        remove_recompile_limit(self._limited)
        self._end_open()
        for root in self._roots.values():
            root.remove()
        super().close()

    @property
    def captured(self) -> Any:
        self._end_open()
        return super().captured

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        root = getattr(self._local, "root", None)
        return (root.regions if root is not None else self._regions)(gm, example_inputs)

    def _compile_starts(self) -> None:
        """Dynamo starts compiling a frame: on a compiled module's first, hook the module
        before Dynamo traces it, and open its first call."""
        self._find_root()

    def _limit_reached(self) -> None:
        """Dynamo reached its recompile limit on a frame (code other compiled models share,
        or compiled too often) and runs it uncompiled, saying so only in its log: a module
        whose first frame it is gets its hooks all the same (its module outputs saved,
        not its ops), and the user a warning."""
        found = self._find_root()
        if found is not None and not self._warned_limit:
            self._warned_limit = True
            warn_recompile_limit(found, "clouseau.backend", recompile_limit())

    def _find_root(self) -> torch.nn.Module | None:
        """The compiled module this thread is calling through this backend, hooked (and
        its first call opened) when first met; None for a compiled function or a frame
        compiled for another backend."""
        found = compiled_call(self)
        module = _module_of(found[0]) if found is not None else None
        if module is None or found is None:
            return None
        with self._lock:
            if id(module) in self._roots:
                return module
            root = self._roots[id(module)] = _Root(self, module)
        root.begin(found[1], found[2], found_running=True)
        return module

    def __repr__(self) -> str:
        return f"clouseau.backend(compiler={self._compiler!r})"


class _Root:
    """One compiled module of a :class:`Backend`: its hooks, its regions, its open call."""

    def __init__(self, backend: Backend, model: torch.nn.Module) -> None:
        select, sink = backend._select, backend._sink
        self._backend = backend
        self._sink = sink
        inner: Compiler | None = backend._inner
        self.regions = RegionCompiler(
            select,
            sink,
            intervene=backend._intervene,
            compiler=inner,
            root=model,
            module_outputs=False,
        )
        self.hooks = ModuleHooks(
            model, select, sink, hooked_paths(model, select), trace_kind=TraceKind.TORCH_DYNAMO
        )
        self.inputs = InputPoints(model, select, sink)
        self._open: tuple[ExitStack, int, Any] | None = None
        self._running = False  # whether the open call is the first, whose end no hook sees
        # The first call's arguments (the tuple Dynamo's wrapper holds): a compiled frame
        # that runs the root's hooks itself (``nn.Sequential``) calls them within it.
        self._first: Any = None
        self._handles = (
            model.register_forward_pre_hook(self._pre_hook, with_kwargs=True),
            model.register_forward_hook(self._hook, always_call=True),
        )

    def remove(self) -> None:
        """Stop capturing (the backend closed)."""
        for handle in self._handles:
            handle.remove()

    @torch.compiler.disable
    def _pre_hook(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        # The compiled model's calls only, not the eager model's: Dynamo's wrapper is the
        # caller of the module's __call__ (a few frames up).
        found = compiled_call(self._backend, depth=_CALLERS)
        if found is not None:
            if found[1] is not self._first:  # not the first call's own root call
                self.begin(args, kwargs)
        elif self._running:
            self.end()  # the first call is over: the model runs eagerly now

    @torch.compiler.disable
    def _hook(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self.end(_raised())

    def begin(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], *, found_running: bool = False
    ) -> None:
        """Open a call of the capture (ending the first one, whose end no hook saw);
        ``found_running``: the first call, found by Dynamo's start while it runs."""
        if self._open is not None and not self._running:
            return  # the model called inside its own call: the same call
        self.end()
        self._running = found_running
        self._first = args if found_running else None
        stack = ExitStack()
        call = stack.enter_context(SinkCall(self._sink))
        stack.enter_context(self.hooks.within(call))
        stack.enter_context(self.regions.call(call))
        inputs = self.inputs.copy(args, kwargs)  # before the model changes them in place
        self._open = (stack, call, inputs)
        self._backend._local.root = self

    def end(self, error: BaseException | None = None) -> None:
        """End the open call, if any: its values saved, or failed with ``error``."""
        opened, self._open = self._open, None
        if opened is None:
            return
        self._running, self._first = False, None
        self._backend._local.root = None
        stack, call, inputs = opened
        if error is not None:
            stack.__exit__(type(error), error, error.__traceback__)
            return
        try:
            self.inputs.put(call, inputs)
        finally:
            stack.close()


def _module_of(fn: Any) -> torch.nn.Module | None:
    """The module ``torch.compile`` was given, from the callable Dynamo's wrapper calls:
    its ``__call__`` (a bound method), or a function wrapping it (``nn.Sequential``'s
    forward is a torch.nn function Dynamo wraps)."""
    for _ in range(4):
        if isinstance(fn, torch.nn.Module):
            return fn
        bound = getattr(fn, "__self__", None)
        fn = bound if isinstance(bound, torch.nn.Module) else getattr(fn, "__wrapped__", None)
    return None


_CALLERS = 8  # frames from a root's pre-hook up to Dynamo's wrapper of its __call__


def _raised() -> BaseException | None:
    """The error a module's ``always_call`` forward hook runs after, if any."""
    import sys

    return sys.exc_info()[1]
