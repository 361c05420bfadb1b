"""One run of a traced GraphModule on the example inputs: value specs and mutation facts.

The run gives every node's shape and dtype (as fx's ShapeProp does) and, for the
snapshot semantics of save nodes, which values a *later* node mutates in place. Aliasing is
observed rather than guessed: two values alias when they share a storage, and a node
mutates a value when the version counter of one of its inputs moves while it runs (the
counter is shared by a tensor and all its views). The run leaves the model as it found it:
buffers (BatchNorm running statistics) are restored and the RNG is forked.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.fx.immutable_collections import immutable_dict, immutable_list

from clouseau.capture.torch._compat import tensor_version, tree_leaves
from clouseau.capture.torch.tracing.elements import Leaf, leaves_of
from clouseau.capture.torch.tracing.live import GradCell, LivePlan
from clouseau.capture.torch.tracing.specs import is_plain_value, spec_of
from clouseau.ir.graph import Spec

StorageKey = tuple[str, int]


@dataclass(frozen=True)
class Probe:
    """What one run showed, by fx node name.

    ``mutated_later``: values a later node changes in place (saved as a snapshot).
    ``escapes``: values sharing storage with an input, a parameter or buffer, or an output
    of the model, which the user (or an optimizer) may write after the call returns, so
    the host copy of a saved one must be a copy. Every other value is private to the call.
    """

    specs: dict[str, Spec]
    mutated_later: frozenset[str]
    escapes: frozenset[str]
    plain: frozenset[str] = frozenset()  # values that are Python scalars, shapes or None
    # The tensors inside each container-valued module output (tracing/elements.py).
    containers: Mapping[str, tuple[Leaf, ...]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class FirstRun:
    """The user's first call, run once by the probe: its output and every value at birth.

    ``changed``: the values as an intervention changed them (by the producer's fx node
    name); ``grads``: where the call's gradient taps send gradients.
    """

    output: Any
    values: dict[str, Any]
    changed: dict[str, Any] = field(default_factory=dict)
    grads: GradCell | None = None

    def value(self, key: str, *, changed: bool = False) -> Any:
        """Node ``key``'s value at birth; ``changed``: as the intervention on it returned it."""
        return self.changed.get(key, self.values[key]) if changed else self.values[key]


class _Recorder(fx.Interpreter):
    def __init__(
        self,
        gm: fx.GraphModule,
        *,
        keep: bool = False,
        plan: LivePlan | None = None,
        outputs: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(gm, garbage_collect_values=False)  # keep storages alive and distinct
        self.keep = keep
        self.plan = plan
        self.outputs = outputs  # the module outputs, whose containers' leaves are recorded
        self.containers: dict[str, tuple[Leaf, ...]] = {}
        self.values: dict[str, Any] = {}
        self.changed: dict[str, Any] = {}
        self.plain: set[str] = set()
        self.specs: dict[str, Spec] = {}
        self.storages: dict[str, set[StorageKey]] = {}
        self.mutations: list[set[StorageKey]] = []  # per node, in order

    def run_node(self, n: fx.Node) -> Any:
        inputs = [t for a in n.all_input_nodes for t in _tensors(self.env[a])]
        versions = [tensor_version(t) for t in inputs]
        result = super().run_node(n)
        mutated = {
            _storage(t) for t, v in zip(inputs, versions, strict=True) if tensor_version(t) != v
        }
        self.mutations.append(mutated)
        if is_plain_value(result):
            self.plain.add(n.name)
            if self.keep:
                self.values[n.name] = result
        elif self.keep and isinstance(result, torch.Tensor):
            # A copy taken now: a later in-place op may change the value itself.
            self.values[n.name] = result.detach().clone()
        self.specs[n.name] = spec_of(result)
        if n.name in self.outputs and not isinstance(result, torch.Tensor):
            self.containers[n.name] = leaves_of(result, spec_of, self.keep)
        self.storages[n.name] = {_storage(t) for t in _tensors(result)}
        if self.plan is not None:
            result = self._change(n.name, result)
        return result

    def _change(self, name: str, result: Any) -> Any:
        """Apply the plan's intervention and gradient tap to node ``name``'s value."""
        changed = self.plan.apply(name, result)  # type: ignore[union-attr]
        if changed is not result and isinstance(changed, torch.Tensor):
            self.changed[name] = changed.detach().clone()
            self.storages[name] |= {_storage(changed)}  # later ops read (and mutate) it
        return changed


def probe(
    gm: fx.GraphModule,
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    outputs: frozenset[str] = frozenset(),
) -> Probe:
    """Run ``gm`` once on copies of ``inputs``, leaving ``model``'s state and the RNG as they
    were; ``outputs``: the module outputs' fx names (their containers' leaves are kept)."""
    recorder = _Recorder(gm, outputs=outputs)
    copies = tuple(_copy(x) for x in inputs)
    with torch.no_grad(), restoring_buffers(model), _forked_rng(inputs):
        recorder.run(*copies)
    return _facts(gm, model, recorder)


def probe_call(
    gm: fx.GraphModule,
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    plan: LivePlan | None = None,
    outputs: frozenset[str] = frozenset(),
) -> tuple[Probe, FirstRun]:
    """Run ``gm`` on ``inputs`` as the user's call itself: hooks, buffers, RNG move once.

    Besides the facts, it returns the call's output and a copy of every tensor value as
    it was produced, from which the call's saves are taken: nothing runs twice. ``plan``
    applies the interventions and gradient taps of the graph that later calls run.
    """
    recorder = _Recorder(gm, keep=True, plan=plan, outputs=outputs)
    output = _plain(recorder.run(*inputs))
    grads = plan.grads if plan is not None else None
    return _facts(gm, model, recorder), FirstRun(output, recorder.values, recorder.changed, grads)


def _plain(value: Any) -> Any:
    """The interpreter's output as the generated code returns it: fx's immutable
    containers are plain ``dict``/``list`` there; the user's own containers (an
    ``OrderedDict``, a namedtuple, a dataclass) stay as they are."""
    if type(value) is dict or type(value) is immutable_dict:
        return {k: _plain(v) for k, v in value.items()}
    if type(value) is OrderedDict:
        return OrderedDict((k, _plain(v)) for k, v in value.items())
    if type(value) is list or type(value) is immutable_list:
        return [_plain(v) for v in value]
    if type(value) is tuple:
        return tuple(_plain(v) for v in value)
    return value


def _facts(gm: fx.GraphModule, model: torch.nn.Module, recorder: _Recorder) -> Probe:
    order = [n.name for n in gm.graph.nodes]
    later: set[StorageKey] = set()
    mutated_later: set[str] = set()
    # Walk backwards: a value needs a snapshot when a node after it mutates its storage.
    for name, mutated in zip(reversed(order), reversed(recorder.mutations), strict=True):
        if recorder.storages.get(name, set()) & later:
            mutated_later.add(name)
        later |= mutated
    return Probe(
        recorder.specs,
        frozenset(mutated_later),
        _escapes(gm, model, recorder),
        frozenset(recorder.plain),
        recorder.containers,
    )


def _escapes(gm: fx.GraphModule, model: torch.nn.Module, recorder: _Recorder) -> frozenset[str]:
    state = (*model.parameters(), *model.buffers())
    external = {_storage(t) for t in state}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            external |= recorder.storages.get(node.name, set())
    return frozenset(name for name, found in recorder.storages.items() if found & external)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _storage(t: torch.Tensor) -> StorageKey:
    return (str(t.device), t.untyped_storage().data_ptr())


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list | tuple) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


@contextmanager
def restoring_buffers(model: torch.nn.Module) -> Iterator[None]:
    saved = [
        (module, name, buf, buf.detach().clone(), tensor_version(buf))
        for module in model.modules()
        for name, buf in module.named_buffers(recurse=False)
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, buf, copy, version in saved:
                if getattr(module, name) is not buf:
                    setattr(module, name, buf)
                # Only a buffer written meanwhile (BatchNorm's kernel writes its running
                # statistics without moving the version): a needless write would move the
                # version and fail a backward through a graph that read the buffer.
                if tensor_version(buf) != version or not _same(buf, copy):
                    buf.copy_(copy)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a == b).logical_or_(a.isnan() & b.isnan()).all())


@contextmanager
def _forked_rng(inputs: tuple[Any, ...]) -> Iterator[None]:
    devices = sorted({t.device.index or 0 for t in _tensors(inputs) if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        yield
