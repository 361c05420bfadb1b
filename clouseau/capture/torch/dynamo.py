"""The tiers after fx and export: TorchDynamo regions, then module hooks.

A model whose Python control flow depends on tensor values (``if x.mean() > 0``, a
``while`` on a norm, Mixture-of-Experts routing with ``if mask.any()``) cannot be traced
into one static graph. The *dynamic tier* compiles it with ``torch.compile`` and a
:class:`~clouseau.capture.torch.regions.RegionCompiler` backend: each region between
graph breaks is instrumented like a static graph, and a call records the branch it
actually took. If Dynamo itself fails, the *hook tier* saves every module's output
through forward hooks. Either way a warning names the tier and why: a model that runs
eagerly is never refused.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch

from clouseau.capture._common import SinkCall, first_line
from clouseau.capture.torch._quiet import quiet_dynamo
from clouseau.capture.torch.flop_ops import category
from clouseau.capture.torch.host import to_numpy
from clouseau.capture.torch.naming import is_user_file, spec_of
from clouseau.capture.torch.regions import RegionCompiler, RootSkipped
from clouseau.ir.actions import Action
from clouseau.ir.flops import category_attr
from clouseau.ir.graph import Graph, ModuleInfo, Node, NodeKind, OpaqueSpec, Ref, TraceKind
from clouseau.ir.selection import SelectLike, select_points
from clouseau.ir.sink import SavedValue, Sink
from clouseau.ir.verify import verify


class DynamicTier:
    """``model`` compiled by Dynamo; every region saves into the call this tier opens."""

    name = "dynamic (TorchDynamo)"

    def __init__(
        self,
        model: torch.nn.Module,
        select: SelectLike,
        sink: Sink,
        intervene: Mapping[Any, Action] | None,
    ) -> None:
        self.compiler = RegionCompiler(select, sink, intervene=intervene, root=model)
        self.compiled = torch.compile(model, backend=self.compiler)
        self.hooks = HookTier(model, select, sink)
        self._sink = sink
        # Set when Dynamo itself failed: why, for the warning of the hook tier.
        self.failure: str | None = None

    @property
    def traces(self) -> int:
        return self.compiler.traces + self.hooks.traces

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Until the root's forward is compiled, a call may start over with hooks: the
        # random draws made before that must be drawn again alike.
        rng = None if self.compiler.root_compiled else torch.get_rng_state()
        with SinkCall(self._sink) as call:
            try:
                with self.compiler.call(call), quiet_dynamo():
                    out = self.compiled(*args, **kwargs)
            except Exception as error:
                if not dynamo_failed(error):
                    raise
                # Dynamo failed, on its own or on the model's error met while compiling:
                # the eager run with hooks tells which (and raises the model's own error).
                if rng is not None:
                    torch.set_rng_state(rng)
                out = self.hooks.run(call, args, kwargs)
                skipped = _root_skipped(error)
                self.failure = str(skipped) if skipped else f"TorchDynamo: {first_line(error)}"
        return out


def _root_skipped(error: BaseException | None) -> RootSkipped | None:
    """The :class:`RootSkipped` behind Dynamo's wrapping of a backend failure, if any."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, RootSkipped):
            return error
        error = getattr(error, "inner_exception", None) or error.__cause__
        seen += 1
    return None


def dynamo_failed(error: BaseException) -> bool:
    """Whether ``error`` is Dynamo's own failure (not the model's error)."""
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(error, TorchDynamoException)


class HookTier:
    """Every module's output, saved through forward hooks while the model runs eagerly.

    The graph (one point per module call that returned a tensor, named by module path,
    ``<path>_<n>`` for the n-th repeat) is built from the first call and recorded once; a
    call that meets other modules records a new graph.
    """

    name = "hook"

    def __init__(self, model: torch.nn.Module, select: SelectLike, sink: Sink) -> None:
        self._model = model
        self._select = select
        self._sink = sink
        self._graphs: dict[tuple[str, ...], tuple[int, frozenset[str]]] = {}
        self.traces = 0

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        sink = self._sink
        call = sink.begin_call()
        try:
            out = self.run(call, args, kwargs)
        except BaseException as error:
            sink.fail_call(call, error)
            raise
        sink.end_call(call)
        return out

    def run(self, call: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the model eagerly, putting every selected module output into ``call``."""
        seen: list[tuple[str, torch.nn.Module, torch.Tensor]] = []
        handles = [
            module.register_forward_hook(partial(_record, seen, path))
            for path, module in self._model.named_modules()
            if path
        ]
        try:
            out = self._model(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        named = _name_repeats(seen)
        graph_id, chosen = self._graph(named)
        values = [SavedValue((name,), name, to_numpy(t)) for name, _, t in named if name in chosen]
        self._sink.put(call, graph_id, values)
        return out

    def _graph(
        self, named: list[tuple[str, torch.nn.Module, torch.Tensor]]
    ) -> tuple[int, frozenset[str]]:
        key = tuple(name for name, _, _ in named)
        found = self._graphs.get(key)
        if found is None:
            graph = _module_graph(self._model, named)
            chosen = frozenset(p.name for p in select_points(graph, self._select, strict=False))
            found = self._graphs[key] = (self._sink.add_graph(graph), chosen)
            self.traces += 1
        return found


def _record(
    seen: list[tuple[str, torch.nn.Module, torch.Tensor]],
    path: str,
    module: torch.nn.Module,
    args: Any,
    output: Any,
) -> None:
    if isinstance(output, torch.Tensor):
        # A snapshot: a later in-place op must not change what this call saw.
        seen.append((path, module, output.detach().clone()))


def _name_repeats(
    seen: list[tuple[str, torch.nn.Module, torch.Tensor]],
) -> list[tuple[str, torch.nn.Module, torch.Tensor]]:
    counts: dict[str, int] = {}
    named = []
    for path, module, t in seen:
        n = counts.get(path, 0)
        counts[path] = n + 1
        named.append((path if n == 0 else f"{path}_{n}", module, t))
    return named


def _module_graph(
    model: torch.nn.Module, named: list[tuple[str, torch.nn.Module, torch.Tensor]]
) -> Graph:
    # The inputs as one opaque value: module outputs are the points of this tier.
    nodes = [Node("input", NodeKind.INPUT, "input", outputs=(OpaqueSpec("inputs"),))]
    for name, module, t in named:
        spec = spec_of(t)
        nodes.append(
            Node(
                name=name,
                kind=NodeKind.OP,
                op=type(module).__name__.lower(),
                inputs=(Ref("input"),),
                outputs=(spec,),
                module=name,
                module_type=type(module).__name__,
                attrs=category_attr(category(type(module).__name__)),
            )
        )
    nodes.append(Node("output", NodeKind.OUTPUT, "output"))
    modules = tuple(
        ModuleInfo(path, type(m).__name__, sum(p.numel() for p in m.parameters()))
        for path, m in model.named_modules()
    )
    return verify(
        Graph(
            nodes=tuple(nodes),
            name=type(model).__name__,
            trace_kind=TraceKind.TORCH_HOOKS,
            modules=modules,
            meta=(("training", model.training), ("tier", "hooks")),
        )
    )


def warn_tier(model: torch.nn.Module, tier: str, reasons: tuple[str, ...]) -> None:
    """Say which tier ``model`` uses and why the earlier ones failed."""
    why = "; ".join(reasons)
    warnings.warn(
        f"clouseau: {type(model).__name__} uses the {tier} tier ({why}). Calls record the "
        "branch each call takes; see docs/dynamic.md.",
        UserWarning,
        stacklevel=_user_level(),
    )


def _user_level() -> int:
    """The ``stacklevel`` of the innermost user frame: the warning points at the call."""
    frame: Any = sys._getframe(2)  # warn_tier's caller: stacklevel 2
    level = 2
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 2
