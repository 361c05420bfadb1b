"""The tiers after fx and export: TorchDynamo regions, then module hooks.

A model whose Python control flow depends on tensor values (``if x.mean() > 0``, a
``while`` on a norm, Mixture-of-Experts routing with ``if mask.any()``) cannot be traced
into one static graph. The *dynamic tier* compiles it with ``torch.compile`` and a
:class:`~clouseau.capture.torch.dynamic.regions.RegionCompiler` backend: each region between
graph breaks is instrumented like a static graph, and a call records the branch it
actually took; module outputs are saved by forward hooks (:mod:`runtime.hooks`). If Dynamo
itself fails, the *hook tier* saves every module's output through forward hooks alone
(:mod:`runtime.tiers` holds the sequence). Either way a warning names the tier and why: a model that runs
eagerly is never refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from clouseau.capture._common import SinkCall, first_line
from clouseau.capture.torch._compat import (
    compile_isolated,
    dynamo_exception,
    recompile_limit,
    recompile_limit_hits,
)
from clouseau.capture.torch._quiet import quiet_dynamo
from clouseau.capture.torch.dynamic.regions import RegionCompiler
from clouseau.capture.torch.naming.points import element_paths
from clouseau.capture.torch.runtime.hooks import ModuleHooks, hooked_paths
from clouseau.capture.torch.runtime.host import to_numpy
from clouseau.capture.torch.runtime.tiers import Tier, warn_recompile_limit
from clouseau.capture.torch.tracing.specs import spec_of
from clouseau.capture.torch.tracing.traced import bind, forward_signature
from clouseau.ir.actions import Action
from clouseau.ir.graph import Graph, Node, NodeKind, TraceKind
from clouseau.ir.passes import insert_saves
from clouseau.ir.selection import SelectLike, select_points
from clouseau.ir.sink import SavedValue, Sink
from clouseau.ir.verify import verify


class DynamicTier:
    """``model`` compiled by Dynamo; every region saves into the call this tier opens.

    Module outputs are saved by forward hooks (:class:`ModuleHooks`, one graph break each,
    run eagerly on the real values), ops by the regions: a module call is saved, named as
    on the traced path, whether Dynamo compiled the frame around it, skipped it (a graph
    break inside a loop), or a loop ran it another number of times.
    """

    tier = Tier.DYNAMO
    name = Tier.DYNAMO.value

    def __init__(
        self,
        model: torch.nn.Module,
        select: SelectLike,
        sink: Sink,
        intervene: Mapping[Any, Action] | None,
    ) -> None:
        self.compiler = RegionCompiler(
            select, sink, intervene=intervene, root=model, module_outputs=False
        )
        # Its own cache of compiled frames: other compiled models' frames of shared code
        # (nn.Module's call wrapper, a layer class's forward) do not use up its recompiles.
        self.compiled = compile_isolated(model, self.compiler)
        self.hooks = ModuleHooks(
            model, select, sink, hooked_paths(model, select), trace_kind=TraceKind.TORCH_DYNAMO
        )
        self.inputs = InputPoints(model, select, sink)
        self._model = model
        self._sink = sink
        # Set when Dynamo itself failed: why, for the warning of the hook tier.
        self.failure: str | None = None
        self._warned_limit = False  # whether a recompile limit hit was reported

    @property
    def traces(self) -> int:
        return self.compiler.traces + self.hooks.graphs + self.inputs.graphs

    @property
    def saved(self) -> int:
        """How many values the latest call saved (inputs, hooks and regions)."""
        return self.inputs.saved + self.hooks.saved + self.compiler.saved

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Dynamo may fail after the model drew random numbers: the eager rerun draws alike.
        rng = torch.get_rng_state()
        hits = recompile_limit_hits()
        with SinkCall(self._sink) as call, self.hooks.within(call):
            inputs = self.inputs.copy(args, kwargs)  # before the model changes them in place
            try:
                with self.compiler.call(call), quiet_dynamo():
                    out = self.compiled(*args, **kwargs)
            except Exception as error:
                if not dynamo_failed(error):
                    raise
                # Dynamo failed, on its own or on the model's error met while compiling:
                # the eager run with hooks tells which (and raises the model's own error).
                torch.set_rng_state(rng)
                self.hooks.discard()
                out = self._model(*args, **kwargs)
                self.failure = f"TorchDynamo: {first_line(error)}"
            self.inputs.put(call, inputs)  # a call the model failed saves nothing
        if recompile_limit_hits() != hits and not self._warned_limit:
            # Dynamo ran a frame uncompiled, saying so only in its log (which the tier
            # keeps quiet): the hooks saved its module outputs, no region its ops.
            self._warned_limit = True
            warn_recompile_limit(self._model, self.name, recompile_limit())
        return out


class InputPoints:
    """The model's tensor inputs of each dynamic-tier call, saved as the points ``<argument>``
    (``<argument>.<index or key>`` inside a list, tuple or dict), as the regions name them.

    A region cannot save them: an input that goes straight into a hooked module reaches
    Dynamo only in that module's own frame (the call is a graph break), and a frame's or a
    resumed region's inputs are values computed before, not the model's. One graph of
    input nodes is recorded per sequence of names, ranks and dtypes.
    """

    def __init__(self, model: torch.nn.Module, select: SelectLike, sink: Sink) -> None:
        self._model = model
        self._select = select
        self._sink = sink
        self._signature = forward_signature(model)
        # Per sequence of inputs: its graph (added to the sink at its first put, after the
        # regions of that call: a capture's first graph stays the model's) and its saves.
        self._graphs: dict[tuple[Any, ...], _InputGraph] = {}
        self.graphs = 0
        self.saved = 0  # how many values the latest call saved

    def copy(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[SavedValue]]:
        """Host copies of the selected inputs of one call, and their graph's key."""
        self.saved = 0
        if self._select is None:
            return None, []
        arguments = bind(self._model, args, kwargs, self._signature)
        leaves = [leaf for name, value in arguments.items() for leaf in _tensors(name, value)]
        key = tuple((name, t.dim(), t.dtype) for name, t in leaves)
        found = self._graphs.get(key)
        if found is None:
            found = self._graphs[key] = self._graph(leaves)
        return key, [
            SavedValue(names, node, to_numpy(leaves[i][1])) for i, node, names in found.saves
        ]

    def put(self, call: int, copied: tuple[Any, list[SavedValue]]) -> None:
        """Save what :meth:`copy` took into ``call``."""
        key, values = copied
        self.saved = len(values)
        if not values:
            return
        found = self._graphs[key]
        if found.graph_id < 0:
            found.graph_id = self._sink.add_graph(found.graph)
            self.graphs += 1
        self._sink.put(call, found.graph_id, values)

    def _graph(self, leaves: list[tuple[str, torch.Tensor]]) -> _InputGraph:
        nodes = [Node(name, NodeKind.INPUT, "input", outputs=(spec_of(t),)) for name, t in leaves]
        graph = verify(
            Graph(
                nodes=(*nodes, Node("output", NodeKind.OUTPUT, "output")),
                name=type(self._model).__name__,
                trace_kind=TraceKind.TORCH_DYNAMO,
                meta=(("training", self._model.training), ("tier", "inputs")),
            )
        )
        chosen = {p.name for p in select_points(graph, self._select, strict=False)}
        saves = tuple((i, name, (name,)) for i, (name, _) in enumerate(leaves) if name in chosen)
        return _InputGraph(insert_saves(graph, self._select, strict=False), saves)


@dataclass
class _InputGraph:
    """The graph of one sequence of inputs, its id once added, and (index, node, names)
    per saved input."""

    graph: Graph
    saves: tuple[tuple[int, str, tuple[str, ...]], ...]
    graph_id: int = -1


def _tensors(name: str, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(dotted name, tensor)`` for each tensor of an argument, as Dynamo's sources name
    them (``images.0``)."""
    for suffix, leaf in element_paths(value):
        if isinstance(leaf, torch.Tensor):
            yield name + suffix.replace(":", "."), leaf


def dynamo_failed(error: BaseException) -> bool:
    """Whether ``error`` is Dynamo's own failure (not the model's error)."""
    return isinstance(error, dynamo_exception())


class HookTier:
    """Module outputs saved through forward hooks while the model runs eagerly
    (:class:`ModuleHooks` on ``paths``, every submodule by default): the tier after
    TorchDynamo failed, and ``tier`` HOOKS, the hook path of a model no tracer traces
    whose selection picks module outputs only (:func:`runtime.tiers.after_untraceable`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        select: SelectLike,
        sink: Sink,
        paths: tuple[str, ...] | None = None,
        tier: Tier = Tier.HOOK_FALLBACK,
    ) -> None:
        self.tier = tier
        self.name = tier.value
        self.hooks = ModuleHooks(model, select, sink, paths)

    @property
    def traces(self) -> int:
        return self.hooks.graphs

    @property
    def saved(self) -> int:
        return self.hooks.saved

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.hooks.run(args, kwargs)
