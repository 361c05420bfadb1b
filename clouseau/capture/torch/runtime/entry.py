"""One lowering of one input structure, as the instrumented model calls it (``Entry``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from clouseau.capture.torch.lowering.lower import Lowered, SaveTarget
from clouseau.capture.torch.runtime.host import host_plan, saves_of
from clouseau.capture.torch.runtime.signature import storage_of, tensors_of


class Entry:
    """What a call of one signature needs, looked up once when it is lowered.

    ``run`` is the GraphModule's ``forward`` itself: its ``__call__`` (fx's error wrapper,
    nn.Module's hook checks) costs microseconds a call and serves no one, as users hook
    their own modules, which the graph still calls through their ``__call__``, and this
    module. ``inputs`` picks the GraphModule's inputs for this call shape (the key of an
    entry fixes the count of positional arguments and the keyword names).
    """

    __slots__ = (
        "accepts",
        "from_outputs",
        "grads",
        "graph_id",
        "host",
        "inputs",
        "lowered",
        "outputs",
        "plain",
        "run",
        "saves",
        "targets",
        "tier",
        "unverified",
    )

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
        self.host = host_plan(tuple(t.host_copy for t in self.targets))  # read by every call
        # The model's outputs from the module's first output (a saving call's shortcut).
        self.from_outputs: Callable[[Any], Any] = traced.from_outputs
        self.saves = saves_of(self.targets)  # their names, once (verify keeps them)
        self.grads = bool(lowered.graph.grad_saves)
        # Nothing to save now or at backward: the call is the model's (interventions and
        # all), with no sink bookkeeping.
        self.plain = not (self.targets or self.grads)
        self.accepts = traced.accepts
        self.tier: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None
        # A new shape of this entry's structure: its first saving call checks that no
        # saved value handed out without a copy shares memory beyond the call.
        self.unverified = False

    def verify(self, inputs: tuple[Any, ...], raw: Any, model: torch.nn.Module) -> None:
        """Copy, from now on, every saved value whose memory this call shows to escape.

        The probe of the traced shape decided which saved values are private to a call
        (handed to the sink without a copy). A view at one shape may be a copy at another
        (``reshape``), so a call at a new shape checks the private ones against the
        inputs, the weights and the outputs: a cheap storage comparison.
        """
        self.unverified = False
        private = [i for i, t in enumerate(self.targets) if not t.host_copy]
        if not private:
            return
        external = {storage_of(t) for t in tensors_of((inputs, raw[0]))}
        external |= {storage_of(t) for t in (*model.parameters(), *model.buffers())}
        escaping = {
            i
            for i in private
            if isinstance(raw[1][i], torch.Tensor) and storage_of(raw[1][i]) in external
        }
        if escaping:
            self.targets = tuple(
                replace(t, host_copy=True) if i in escaping else t
                for i, t in enumerate(self.targets)
            )
            self.host = host_plan(tuple(t.host_copy for t in self.targets))


_DIRECT = "_clouseau_direct_attributes"  # set in a GraphModule's __dict__ once done


def _direct_attributes(gm: torch.fx.GraphModule, model: torch.nn.Module) -> None:
    """Let the generated code reach the submodules and weights it reads in one lookup.

    ``self.layer1`` in generated code misses the instance ``__dict__`` (nn.Module keeps
    children in ``_modules``) and falls back to ``nn.Module.__getattr__``, a Python call:
    about 2 us per module call, up to 30% of a small-op model's forward, where an eager
    ``nn.Sequential`` iterates its children directly. Copying each reference into the
    ``__dict__`` of the GraphModule and of its own intermediate containers (plain
    ``nn.Module`` instances fx made to hold the paths) makes each step a dict hit. The
    user's modules are never touched, and ``_modules`` stays the registry. Done once per
    GraphModule: a graph kept for a new instrumented model (runtime/reuse.py) serves the
    same model, whose modules and weights its key holds.
    """
    if gm.__dict__.get(_DIRECT):
        return
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
    gm.__dict__[_DIRECT] = True
