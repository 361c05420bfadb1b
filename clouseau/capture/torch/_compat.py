"""Every private PyTorch internal the torch frontend touches, in one place.

When a PyTorch release moves one of these, this is the only file to change.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import torch
import torch.utils._pytree as _pytree

TreeSpec = _pytree.TreeSpec


def tensor_version(t: torch.Tensor) -> int | None:
    """The in-place modification counter of ``t`` (shared by a tensor and its views);
    None for an inference tensor, which has none."""
    return None if t.is_inference() else t._version


def forward_hooks_of(module: torch.nn.Module) -> dict[int, Any]:
    """``module``'s forward hooks: the live dict ``__call__`` reads (in order)."""
    return module._forward_hooks


def forward_hooks_with_kwargs(module: torch.nn.Module) -> Any:
    """The ids of ``module``'s forward hooks registered ``with_kwargs=True`` (live)."""
    return module._forward_hooks_with_kwargs


def forward_pre_hooks(module: torch.nn.Module) -> dict[int, Any]:
    """``module``'s forward pre-hooks (the live dict)."""
    return module._forward_pre_hooks


# nn.Module.__call__'s process-wide hooks (dicts changed in place when hooks are added).
_GLOBAL_HOOKS = (
    torch.nn.modules.module._global_backward_pre_hooks,
    torch.nn.modules.module._global_backward_hooks,
    torch.nn.modules.module._global_forward_hooks,
    torch.nn.modules.module._global_forward_pre_hooks,
)


def module_dispatches(module: torch.nn.Module) -> bool:
    """Whether ``nn.Module.__call__`` would do more than call ``module.forward``: a hook
    (of the module's, or process-wide), ``module.compile()`` or a ``torch.jit.trace``
    recording. When it would not, calling ``forward`` directly saves two Python frames."""
    return bool(
        module._compiled_call_impl is not None
        or module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
        or any(_GLOBAL_HOOKS)
        or torch._C._get_tracing_state()
    )


def dynamo_exception() -> type[BaseException]:
    """The base class of TorchDynamo's own errors (not the model's)."""
    from torch._dynamo.exc import TorchDynamoException

    return TorchDynamoException


# The modules of forward hooks a model library installs as part of its own forward:
# transformers' output capturing (``capture_outputs``, 5.x; ``check_model_inputs``, 4.5x)
# collects ``hidden_states`` and ``attentions`` through hooks on its layers, while forward
# runs, into the output it returns. They are the model's code: the tracers trace them.
_MODEL_HOOK_MODULES = ("transformers.utils.output_capturing", "transformers.utils.generic")


def is_model_hook(hook: Any) -> bool:
    """Whether ``hook`` is part of the model's own forward (see ``_MODEL_HOOK_MODULES``):
    it runs while the model is traced, as its forward does, and never again in the graph
    (outside the library's forward it does nothing)."""
    return getattr(hook, "__module__", None) in _MODEL_HOOK_MODULES


def user_forward_hooks(module: torch.nn.Module) -> dict[int, Any]:
    """``module``'s forward hooks without clouseau's own (:mod:`runtime.hooks`), which save
    nothing while a model is traced and are no user's code to reproduce in a graph, and
    without the model library's own (:func:`is_model_hook`), which are traced."""
    return {
        k: h
        for k, h in module._forward_hooks.items()
        if not getattr(h, "clouseau_hook", False) and not is_model_hook(h)
    }


def example_value(value: Any) -> Any:
    """A backend's example input as a real value: a symbolic int (a size Dynamo made
    dynamic) as the int it stands for in this call, without adding a guard."""
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        hint = value.node.hint
        return hint if hint is not None else value
    return value


def tree_flatten(tree: Any) -> tuple[list[Any], TreeSpec]:
    """Flatten with torch's pytree registry (the one torch.export used for in/out specs)."""
    return _pytree.tree_flatten(tree)


def tree_unflatten(leaves: list[Any], spec: TreeSpec) -> Any:
    """Unflatten, each ``ModelOutput`` with the flattened one's keys in their order: its
    pytree node rebuilds it by its constructor (field order, keys set to None dropped)."""
    _in_key_order(tree := _pytree.tree_unflatten(leaves, spec), spec)
    return tree


def set_in_order(mapping: OrderedDict[Any, Any], items: Iterable[tuple[Any, Any]]) -> None:
    """Set ``items`` in ``mapping`` (a ``ModelOutput``) in their order, None ones too."""
    for key, value in items:
        mapping[key] = value
        mapping.move_to_end(key)


def _in_key_order(tree: Any, spec: TreeSpec) -> None:
    if spec.is_leaf():
        return
    if isinstance(tree, OrderedDict) and isinstance(spec.context, list):  # its keys
        set_in_order(tree, [(key, tree.get(key)) for key in spec.context])
        children = [tree[key] for key in spec.context]
    else:
        children = _pytree.SUPPORTED_NODES[spec.type].flatten_fn(tree)[0]
        if len(children) != spec.num_children:
            return  # a cache rebuilt with other contents (Reformer's buckets): no keys below
    for value, child in zip(children, spec.children(), strict=True):
        _in_key_order(value, child)


def tree_map(fn: Any, tree: Any) -> Any:
    return _pytree.tree_map(fn, tree)


def tree_leaves(tree: Any) -> list[Any]:
    return _pytree.tree_leaves(tree)


def is_registered_node(value: Any) -> bool:
    """Whether ``value``'s type is a pytree node registered by a library (a cache object)."""
    return type(value) in _pytree.SUPPORTED_NODES


def is_op_overload(target: Any) -> bool:
    """Whether an fx call target is an ATen operator (``torch.ops.aten.add.Tensor``)."""
    return isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket)


def dynamic_fake_mode() -> tuple[Any, Any]:
    """A fake-tensor mode whose tensors get a symbol per dimension, and its shape env.

    ``duck_shape=False``: two dimensions of equal size are not assumed to be one symbol;
    ``specialize_zero_one=False``: a dimension of size 1 in the example stays a symbol.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
    # This env only labels the IR's shapes; no guard of it is shown to anyone. Recording
    # each symbol's source location walks the stack against a skip list whose first use
    # imports torch.export._trace, networkx and Inductor (40% of a cold ResNet-18 call).
    env._get_stack_summary = _no_stack_summary
    return FakeTensorMode(shape_env=env, allow_non_fake_inputs=True), env


def _no_stack_summary(is_debug: bool = False, framework_loc: Any = None) -> tuple[Any, str]:
    """``ShapeEnv._get_stack_summary`` without the stack: the location given, or none."""
    from torch._guards import SLoc

    return SLoc(framework_loc, None), ""


def fake_from_tensor(mode: Any, t: torch.Tensor) -> torch.Tensor:
    """A fake copy of ``t`` in ``mode`` with every dimension symbolic."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim())
    return mode.from_tensor(t, symbolic_context=context)


def simplified(env: Any, expr: Any) -> Any:
    """``expr`` with what the run pinned (``s1 == 64``) substituted."""
    return env.simplify(expr)


def check_export_inputs(
    placeholders: list[Any], flat_args_with_path: list[Any], range_constraints: Any
) -> None:
    """Raise if the inputs break an exported graph's shape guards (as ``ep.module()`` does)."""
    from torch._export.utils import _check_input_constraints_for_graph

    _check_input_constraints_for_graph(placeholders, flat_args_with_path, range_constraints)


def clear_dimension_marks(tensor: torch.Tensor) -> None:
    """Drop the marks ``torch.export(dynamic_shapes=Dim.AUTO)`` puts on an input tensor
    (``maybe_mark_dynamic``'s attributes). torch removes them after an export that
    succeeds only: after one that fails, a static export of the same tensor (and a later
    ``torch.compile`` of the user's call) would still read its dimensions as dynamic."""
    from torch._export.non_strict_utils import _clean_dynamic_markers

    _clean_dynamic_markers(tensor)


def tree_flatten_with_path(tree: Any) -> tuple[list[Any], TreeSpec]:
    return _pytree.tree_flatten_with_path(tree)


def dynamo_frame_module() -> Any:
    """In a ``torch.compile`` backend call: the module whose method Dynamo is compiling
    (the frame's first argument), or None."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        first = tx.f_code.co_varnames[0] if tx.f_code.co_argcount else None
        found = tx.f_locals.get(first) if first else None
        if not isinstance(found, torch.nn.Module):
            # A resume function (the code after a graph break) takes the live stack
            # values first, and ``self`` only while still used: the module it runs in is
            # the one whose ``__call__`` is the innermost running (it calls the resume).
            found = tx.f_locals.get("self")
            if not isinstance(found, torch.nn.Module):
                found = running_module()
    except Exception:
        return None
    return found if isinstance(found, torch.nn.Module) else None


def running_module() -> Any:
    """The module of the innermost ``Module._call_impl`` running in this thread, or None."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_call_impl" and code.co_filename == _MODULE_FILE:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


_MODULE_FILE = torch.nn.Module._call_impl.__code__.co_filename


def register_cache_pytrees(model: torch.nn.Module) -> None:
    """Make Hugging Face cache objects (``DynamicCache``, ...) pytrees, for torch.export.

    A transformers model's default call builds and returns a cache; torch.export refuses
    an output type it cannot flatten. transformers' own exporter registers every ``Cache``
    subclass (and the model module's ``*Cache`` classes); registering twice is a no-op.
    Models of other libraries are left alone.
    """
    if not type(model).__module__.startswith("transformers."):
        return
    try:
        from transformers.exporters import exporter_dynamo
    except ImportError:  # another transformers release: leave the caches as they are
        return
    exporter_dynamo.register_cache_pytrees_for_model(model)
    for cls, node in list(_pytree.SUPPORTED_NODES.items()):
        if node.flatten_fn is getattr(exporter_dynamo, "_pytree_flatten", None):
            _lift_counters(cls, node)


# Per-step counters of cache layers (``DynamicSlidingWindowLayer.cumulative_length``).
# transformers' flatten keeps a plain int in the tree spec, so each decode step would have
# a new structure and a new export; as a leaf it is an input of the graph instead.
_COUNTERS = ("cumulative_length",)


def _lift_counters(cls: type, node: Any) -> None:
    """Re-register ``cls`` with ``node``'s flatten, each counter of :data:`_COUNTERS`
    moved to the end of the leaves (as a transformers ``"sym"`` entry, which its unflatten
    reads back from the leaves as it is), whatever the counter holds: an int, or while
    torch.export traces, the wrapper or symbolic int export put there. Always last, so
    a real call and its fake trace order their leaves alike."""
    original = node.flatten_fn

    def flatten(obj: Any) -> tuple[list[Any], Any]:
        leaves, context = original(obj)
        counters: list[Any] = []
        dropped: set[int] = set()
        context = _lifted(context, obj, counters, dropped)
        kept = [leaf for i, leaf in enumerate(leaves) if i not in dropped]
        moved = {i: n for n, i in enumerate(i for i in range(len(leaves)) if i not in dropped)}
        return kept + counters, _renumbered(context, moved, len(kept))

    def flatten_with_keys(obj: Any) -> tuple[list[Any], Any]:
        leaves, context = flatten(obj)
        return [(_pytree.SequenceKey(i), leaf) for i, leaf in enumerate(leaves)], context

    serialized = _pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
    _pytree._deregister_pytree_node(cls)
    _pytree.register_pytree_node(
        cls,
        flatten,
        node.unflatten_fn,
        serialized_type_name=serialized.serialized_type_name if serialized else None,
        flatten_with_keys_fn=flatten_with_keys,
    )


def _lifted(context: Any, value: Any, counters: list[Any], dropped: set[int]) -> Any:
    """``context`` (transformers' JSON-like spec of ``value``) with the n-th counter an
    entry ``{"_t": "sym", "i": -1 - n}`` (numbered by :func:`_renumbered`); a counter
    that already was a leaf leaves its index in ``dropped``."""
    if isinstance(context, list):
        return [_lifted(c, v, counters, dropped) for c, v in zip(context, value, strict=True)]
    if not isinstance(context, dict):
        return context
    kind = context.get("_t")
    if kind == "obj":
        state = {}
        for key, entry in context["s"].items():
            held = vars(value)[key]
            if key in _COUNTERS and held is not None:
                if isinstance(entry, dict) and entry.get("_t") in ("sym", "tensor"):
                    dropped.add(entry["i"])
                counters.append(held)
                state[key] = {"_t": "sym", "i": -len(counters)}
            else:
                state[key] = _lifted(entry, held, counters, dropped)
        return {**context, "s": state}
    if kind == "seq":
        items = zip(context["v"], value, strict=True)
        return {**context, "v": [_lifted(c, v, counters, dropped) for c, v in items]}
    if kind == "map":
        found = context["v"].items()
        return {**context, "v": {k: _lifted(c, value[k], counters, dropped) for k, c in found}}
    if kind is None:
        return {k: _lifted(c, value[k], counters, dropped) for k, c in context.items()}
    return context


def _renumbered(context: Any, moved: dict[int, int], kept: int) -> Any:
    """``context`` with each leaf index where :func:`_lift_counters` put its leaf."""
    if isinstance(context, list):
        return [_renumbered(c, moved, kept) for c in context]
    if not isinstance(context, dict):
        return context
    if context.get("_t") in ("sym", "tensor"):
        i = context["i"]
        return {**context, "i": kept - 1 - i if i < 0 else moved[i]}
    return {k: _renumbered(c, moved, kept) for k, c in context.items()}


def lookup_backend(compiler: Any) -> Any:
    """The ``torch.compile`` backend callable of a name (``"inductor"``) or callable."""
    from torch._dynamo import lookup_backend as lookup

    return lookup(compiler)


def pytree_children(value: Any) -> list[Any] | None:
    """The children of a value of a registered pytree class (a cache), else None."""
    node = _pytree.SUPPORTED_NODES.get(type(value))
    if node is None:
        return None
    children, _ = node.flatten_fn(value)
    return list(children)


def on_compile_start(callback: Any) -> Any:
    """Run ``callback()`` whenever TorchDynamo starts compiling a frame (before it traces
    it); returns the handle :func:`remove_compile_start` takes."""
    from torch._dynamo.callback import callback_handler

    def started(_: Any) -> None:
        callback()

    callback_handler.register_start_callback(started)
    return started


def remove_compile_start(handle: Any) -> None:
    from torch._dynamo.callback import callback_handler

    if handle in callback_handler.start_callbacks:
        callback_handler.remove_start_callback(handle)


def compiled_call(
    backend: Any, depth: int = 1 << 30
) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """The callable ``torch.compile(..., backend=backend)`` wrapped that this thread is
    calling now, with its arguments: ``(fn, args, kwargs)`` of the innermost such call, or
    None. Read from the frame of Dynamo's wrapper (``compile_wrapper`` in
    ``torch/_dynamo/eval_frame.py``), whose ``callback`` wraps the backend, among the
    ``depth`` frames above the caller."""
    import sys

    frame = sys._getframe(1)
    while frame is not None and depth > 0:
        depth -= 1
        code = frame.f_code
        if code.co_name == "compile_wrapper" and code.co_filename.endswith("eval_frame.py"):
            local = frame.f_locals
            if _wraps(local.get("callback"), backend):
                # The call's own args tuple (one object per call: it tells calls apart).
                return local.get("fn"), local.get("args", ()), local.get("kwargs", {})
        frame = frame.f_back
    return None


def _wraps(callback: Any, backend: Any) -> bool:
    """Whether Dynamo's frame callback ends in ``backend`` (through ``convert_frame``'s
    and ``torch.compile``'s wrappers)."""
    for _ in range(16):
        if callback is None:
            return False
        if callback is backend:
            return True
        inner = getattr(callback, "_torchdynamo_orig_backend", None)
        callback = inner if inner is not None else getattr(callback, "compiler_fn", None)
    return False


def compile_isolated(model: torch.nn.Module, backend: Any) -> Any:
    """``torch.compile(model, backend=backend)`` with its own cache of compiled frames
    where this PyTorch has one (``isolate_recompiles``): the frames it shares with other
    compiled models (``nn.Module``'s call wrapper, a layer class's ``forward``) count
    towards Dynamo's recompile limit for this model alone."""
    if _ISOLATES[0] is None:
        import inspect

        _ISOLATES[0] = "isolate_recompiles" in inspect.signature(torch.compile).parameters
    if _ISOLATES[0]:
        return torch.compile(model, backend=backend, isolate_recompiles=True)
    return torch.compile(model, backend=backend)


_ISOLATES: list[bool | None] = [None]


def recompile_limit() -> int:
    """TorchDynamo's limit of compiled versions per code object."""
    import torch._dynamo.config as config

    return int(config.recompile_limit)


class _LimitHits(logging.Handler):
    """Counts, per thread, TorchDynamo's reports that a frame reached its recompile limit
    (after which Dynamo runs that code without compiling it, saying so only in its log),
    and tells the listeners."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.local = threading.local()
        self.listeners: list[Any] = []

    def filter(self, record: logging.LogRecord) -> bool:
        # Every record: the filters clouseau puts on torch's handlers to keep the dynamic
        # tier quiet (_quiet.py) are not for this one, which only counts.
        return True

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("torch._dynamo hit config."):
            return
        self.local.hits = getattr(self.local, "hits", 0) + 1
        for listener in list(self.listeners):
            listener()


_LIMIT_HITS = _LimitHits()
_LIMIT_LOGGER = "torch._dynamo.convert_frame"  # where Dynamo logs a recompile limit hit


def recompile_limit_hits() -> int:
    """How many times TorchDynamo reached its recompile limit in this thread so far."""
    _watch_limit()
    return getattr(_LIMIT_HITS.local, "hits", 0)


def on_recompile_limit(callback: Any) -> Any:
    """Run ``callback()`` (in the thread running the frame) whenever TorchDynamo reaches its
    recompile limit; returns the handle :func:`remove_recompile_limit` takes."""
    _watch_limit()
    _LIMIT_HITS.listeners.append(callback)
    return callback


def remove_recompile_limit(handle: Any) -> None:
    if handle in _LIMIT_HITS.listeners:
        _LIMIT_HITS.listeners.remove(handle)


def _watch_limit() -> None:
    logger = logging.getLogger(_LIMIT_LOGGER)
    if _LIMIT_HITS not in logger.handlers:
        logger.addHandler(_LIMIT_HITS)
