"""A user's forward hooks on the export path: run on every real call, never on fake tensors.

torch.export traces the model's Python on fake tensors, so a forward hook registered by
the user would run there (a counting hook sees an extra call), and the exported graph,
which calls no submodule, would run it never again. So while export traces, each user
forward hook of a submodule is set aside: the module's tensor inputs are marked
(``clouseau::module_input``) like its outputs are, and after the export a node that calls
the module's hooks on the real inputs and output, as ``nn.Module.__call__`` does, is put
right after the output. The hook runs once per call, on real tensors, and what it returns
is what the rest of the graph reads (the module's point included).

A hooked module whose output is not a single tensor, or that is called inside a region
export keeps as a submodule (``no_grad``, ``autocast``), has its hooks run while export
traces, as before: their effect is in the graph, and the hook sees the fake call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch._compat import (
    forward_hooks_of,
    forward_hooks_with_kwargs,
    is_model_hook,
    tree_flatten,
    tree_unflatten,
    user_forward_hooks,
)


@torch.library.custom_op("clouseau::module_input", mutates_args=())
def _module_input(x: torch.Tensor, call: int, index: int) -> torch.Tensor:
    return x.clone()


@_module_input.register_fake
def _(x: torch.Tensor, call: int, index: int) -> torch.Tensor:
    return torch.empty_like(x)


_module_input.register_autograd(lambda ctx, grad: (grad, None, None))
INPUT_MARK = torch.ops.clouseau.module_input.default
TENSOR = object()  # a tensor's place among a call's input leaves


@dataclass(frozen=True, eq=False)
class HookedCall:
    """A call of a module whose user hooks run in the graph: its inputs' structure."""

    module: torch.nn.Module
    inputs: int  # the call's index among marked inputs
    spec: Any  # pytree spec of (args, kwargs)
    leaves: tuple[Any, ...]  # non-tensor leaves as they were; TENSOR where a tensor was


@dataclass
class Deferred:
    """The user hooks set aside while export traces, and the calls that deferred them."""

    hooks: dict[torch.nn.Module, dict[int, Any]] = field(default_factory=dict)
    with_kwargs: dict[torch.nn.Module, set[int]] = field(default_factory=dict)
    pending: dict[torch.nn.Module, list[tuple[int, Any, tuple[Any, ...]] | None]] = field(
        default_factory=dict
    )
    calls: dict[int, HookedCall] = field(default_factory=dict)  # by output call index
    input_calls: int = 0
    state: tuple[Any, ...] = ()

    def take(self, module: torch.nn.Module, call: int, out: Any, args: Any, kwargs: Any) -> Any:
        """At the module's output: defer its hooks to the graph (a tensor output outside
        any region), or run them now; returns the output the model goes on with."""
        stack = self.pending[module]
        entry = stack.pop() if stack else None  # no pre-hook ran: run the hooks now
        if entry is not None and isinstance(out, torch.Tensor):
            k, spec, leaves = entry
            self.calls[call] = HookedCall(module, k, spec, leaves)
            return out
        return run_hooks(module, self.hooks[module], self.with_kwargs[module], args, kwargs, out)


def run_hooks(
    module: torch.nn.Module,
    hooks: dict[int, Any],
    with_kwargs: set[int],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
) -> Any:
    """The forward hooks as ``nn.Module.__call__`` runs them: a hook's result, if not
    None, replaces the output."""
    for key, hook in list(hooks.items()):
        if is_model_hook(hook):  # the model's own: it ran while the model was traced
            continue
        found = hook(module, args, kwargs, out) if key in with_kwargs else hook(module, args, out)
        if found is not None:
            out = found
    return out


@contextmanager
def deferring(model: torch.nn.Module, state: Callable[[], tuple[Any, ...]]) -> Iterator[Deferred]:
    """Set the user forward hooks of ``model``'s submodules aside while the block exports."""
    deferred = Deferred(state=state())
    handles = []
    # The model's own hooks run around the graph (InstrumentedModule.forward), not in it.
    kept = {model: dict(forward_hooks_of(model))}
    forward_hooks_of(model).clear()
    for module in model.modules():
        hooks = user_forward_hooks(module)
        if module is model or not hooks:
            continue
        kept[module] = dict(forward_hooks_of(module))
        deferred.hooks[module] = hooks
        deferred.with_kwargs[module] = set(forward_hooks_with_kwargs(module))
        deferred.pending[module] = []
        set_aside(module, hooks)
        handles.append(module.register_forward_pre_hook(_pre(deferred, state), with_kwargs=True))
    try:
        yield deferred
    finally:
        for handle in handles:
            handle.remove()
        for module, hooks in kept.items():
            forward_hooks_of(module).clear()
            forward_hooks_of(module).update(hooks)


def set_aside(module: torch.nn.Module, hooks: dict[int, Any]) -> None:
    """Take ``hooks`` (the user's) out of ``module``'s live forward hooks; the model
    library's own stay and run while the model is traced."""
    live = forward_hooks_of(module)
    for key in hooks:
        live.pop(key, None)


def _pre(deferred: Deferred, state: Callable[[], tuple[Any, ...]]) -> Any:
    def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
        if state() != deferred.state:  # inside a region: the hooks run while tracing
            deferred.pending[module].append(None)
            return None
        k = deferred.input_calls
        deferred.input_calls += 1
        leaves, spec = tree_flatten((args, kwargs))
        marked, kept, index = [], [], 0
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                marked.append(_module_input(leaf, k, index))
                kept.append(TENSOR)
                index += 1
            else:
                marked.append(leaf)
                kept.append(leaf)
        deferred.pending[module].append((k, spec, tuple(kept)))
        return tree_unflatten(marked, spec)

    return hook


def take_inputs(graph: fx.Graph) -> dict[int, dict[int, fx.Node]]:
    """Remove the input marks from ``graph``: per hooked call, its marked tensors' nodes."""
    found: dict[int, dict[int, fx.Node]] = {}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is INPUT_MARK:
            source, call, index = node.args
            assert isinstance(source, fx.Node)
            found.setdefault(int(call), {})[int(index)] = source  # type: ignore[arg-type]
            node.replace_all_uses_with(source)
            graph.erase_node(node)
    return found


def hook_nodes(
    graph: fx.Graph,
    deferred: Deferred,
    inputs: dict[int, dict[int, fx.Node]],
    output_of: Callable[[int], fx.Node | None],
) -> dict[int, tuple[fx.Node, fx.Node]]:
    """After each deferred call's output, a node running the module's hooks; every later
    reader reads it. Returns, per call index, (output node, hooks node)."""
    placed: dict[int, tuple[fx.Node, fx.Node]] = {}
    for call, hooked in sorted(deferred.calls.items()):
        out = output_of(call)
        if out is None:
            continue
        tensors = inputs.get(hooked.inputs, {})
        count = sum(leaf is TENSOR for leaf in hooked.leaves)
        arguments = tuple(tensors.get(i) for i in range(count))
        run = _runner(deferred, hooked)
        with graph.inserting_after(out):
            node = graph.call_function(run, (arguments, out))
        node.meta = dict(out.meta)
        out.replace_all_uses_with(node, delete_user_cb=lambda user, node=node: user is not node)
        placed[call] = (out, node)
    return placed


def hooks_runner(module: torch.nn.Module) -> Callable[..., Any]:
    """The fx call target running ``module``'s forward hooks on (args, kwargs, output)."""

    def forward_hooks(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        hooks = forward_hooks_of(module)
        return run_hooks(module, hooks, set(forward_hooks_with_kwargs(module)), args, kwargs, out)

    forward_hooks.clouseau_hooks = True  # type: ignore[attr-defined]
    return forward_hooks


def is_hooks_runner(target: Any) -> bool:
    """Whether an fx call target runs a user's hooks (a shape run skips it: a hook is
    the user's code, run once per call)."""
    return getattr(target, "clouseau_hooks", False)


def _runner(deferred: Deferred, hooked: HookedCall) -> Callable[..., Any]:
    module = hooked.module

    def forward_hooks(tensors: tuple[Any, ...], out: torch.Tensor) -> Any:
        values = iter(tensors)
        leaves = [next(values) if leaf is TENSOR else leaf for leaf in hooked.leaves]
        args, kwargs = tree_unflatten(leaves, hooked.spec)
        # The module's hooks as they are now, as an eager call runs them.
        hooks = forward_hooks_of(module)
        return run_hooks(module, hooks, set(forward_hooks_with_kwargs(module)), args, kwargs, out)

    return forward_hooks
