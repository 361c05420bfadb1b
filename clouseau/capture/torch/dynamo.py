"""The tiers after fx and export: TorchDynamo regions, then module hooks.

A model whose Python control flow depends on tensor values (``if x.mean() > 0``, a
``while`` on a norm, Mixture-of-Experts routing with ``if mask.any()``) cannot be traced
into one static graph. The *dynamic tier* compiles it with ``torch.compile`` and a
:class:`~clouseau.capture.torch.regions.RegionCompiler` backend: each region between
graph breaks is instrumented like a static graph, and a call records the branch it
actually took; module outputs are saved by forward hooks (:mod:`hooks_tier`). If Dynamo
itself fails, the *hook tier* saves every module's output through forward hooks alone
(:mod:`tiers` holds the sequence). Either way a warning names the tier and why: a model that runs
eagerly is never refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from clouseau.capture._common import SinkCall, first_line
from clouseau.capture.torch._compat import dynamo_exception
from clouseau.capture.torch._quiet import quiet_dynamo
from clouseau.capture.torch.hooks_tier import ModuleHooks, hooked_paths
from clouseau.capture.torch.regions import RegionCompiler
from clouseau.capture.torch.tiers import Tier
from clouseau.ir.actions import Action
from clouseau.ir.graph import TraceKind
from clouseau.ir.selection import SelectLike
from clouseau.ir.sink import Sink


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
        self.compiled = torch.compile(model, backend=self.compiler)
        self.hooks = ModuleHooks(
            model, select, sink, hooked_paths(model, select), trace_kind=TraceKind.TORCH_DYNAMO
        )
        self._model = model
        self._sink = sink
        # Set when Dynamo itself failed: why, for the warning of the hook tier.
        self.failure: str | None = None

    @property
    def traces(self) -> int:
        return self.compiler.traces + self.hooks.graphs

    @property
    def saved(self) -> int:
        """How many values the latest call saved (hooks and regions)."""
        return self.hooks.saved + self.compiler.saved

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Dynamo may fail after the model drew random numbers: the eager rerun draws alike.
        rng = torch.get_rng_state()
        with SinkCall(self._sink) as call, self.hooks.within(call):
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
        return out


def dynamo_failed(error: BaseException) -> bool:
    """Whether ``error`` is Dynamo's own failure (not the model's error)."""
    return isinstance(error, dynamo_exception())


class HookTier:
    """Every module's output, saved through forward hooks while the model runs eagerly
    (:class:`ModuleHooks` on every submodule): the tier after TorchDynamo failed."""

    tier = Tier.HOOK_FALLBACK
    name = Tier.HOOK_FALLBACK.value

    def __init__(self, model: torch.nn.Module, select: SelectLike, sink: Sink) -> None:
        self.hooks = ModuleHooks(model, select, sink)

    @property
    def traces(self) -> int:
        return self.hooks.graphs

    @property
    def saved(self) -> int:
        return self.hooks.saved

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.hooks.run(args, kwargs)
