"""Trace a JAX function or a callable pytree to a jaxpr whose module and activation calls are marked.

While tracing, every callable submodule of the model (an ``eqx.Module`` or any pytree node
with ``__call__``) is called through a ``jax.jit`` named ``__clouseau_module_<i>``, and
every :data:`~clouseau.capture.jax.naming.ACTIVATIONS` function of ``jax.nn`` through one
named ``__clouseau_fn_<name>``. The marked jit equations give the exact output values of
each module and activation; :mod:`clouseau.capture.jax.build` turns them into names.
The markers are patched in for the duration of one trace (class ``__call__``, ``jax.nn``
attributes, and the code of the activations JAX inlines: :mod:`.activations`) under a
lock, and always restored.

What a call assigns to the model's state (Flax NNX ``Variable`` s) leaves the jaxpr, and
each module marker, as outputs after the real ones, and is assigned back outside
(:mod:`.state`): ``Traced.state`` says which leaves, ``Traced.marks`` how many outputs of
each marker (``__clouseau_module_<i>_<call>``) are state.

A module or activation that the model itself calls under ``jax.vmap`` (Equinox's
``MultiheadAttention`` vmaps its projections) has its outputs pinned batch axis first
inside the marker (:mod:`~clouseau.capture.jax.batch_pin`), so that its point holds what an eager ``jax.vmap`` of
it returns rather than the layout JAX's batching rule chose (``weight @ x`` batched puts
the batch axis last).
"""

from __future__ import annotations

import inspect
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import numpy as np

from clouseau.capture._common import (
    check_arguments,
    describe_call,
    describe_other,
    first_line,
    inputs_rejected,
    user_frame,
)
from clouseau.capture.jax import _compat, activations, batch_pin, computed_kernels, state
from clouseau.capture.jax.linen import is_linen_apply
from clouseau.capture.jax.naming import ACTIVATIONS, join, key_name, path_name
from clouseau.ir.errors import ClouseauError, TraceError

MODULE_MARK = "__clouseau_module_"
FN_MARK = "__clouseau_fn_"

_PATCH_LOCK = threading.RLock()
_local = threading.local()


@dataclass(frozen=True)
class ModuleEntry:
    """A callable submodule found in the model's pytree."""

    path: str
    type_name: str
    params: int


@dataclass(frozen=True)
class Traced:
    """A jaxpr of ``model(*args, **kwargs)`` with everything needed to name and rerun it."""

    jaxpr: Any  # ClosedJaxpr; invars are the array leaves of (model, args, kwargs)
    in_names: tuple[str, ...]
    in_is_param: tuple[bool, ...]
    modules: tuple[ModuleEntry, ...]  # the i of a module marker indexes this
    root_type: str
    out: Split  # the output's structure and static leaves (array leaves dropped)
    name: str
    # The jaxpr's outputs are the output's arrays, then the new values of the array
    # leaves of (model, args, kwargs) at these positions: the state the call assigns.
    state: tuple[int, ...] = ()
    # Per module marker call (the c of its name): how many of its outputs are state.
    marks: tuple[int, ...] = ()
    # Per fused kernel call (the i of its name): its op and options (computed_kernels).
    kernels: tuple[tuple[str, computed_kernels.Attrs], ...] = ()

    def outputs(self, tree: Any, values: Sequence[Any]) -> Any:
        """The model's output from the jaxpr's outputs, writing the state into ``tree``."""
        n = len(values) - len(self.state)
        state.write_back(tree, self.state, values[n:])
        return self.out.merge(values[:n])


@dataclass(frozen=True)
class Split:
    """A pytree split into its array leaves (traced) and the rest (static)."""

    treedef: Any
    leaves: tuple[Any, ...]
    is_array: tuple[bool, ...]

    @property
    def arrays(self) -> tuple[Any, ...]:
        return tuple(x for x, a in zip(self.leaves, self.is_array, strict=True) if a)

    def static(self) -> Split:
        """The same split without its array leaves (no tracer outlives its trace)."""
        leaves = tuple(None if a else x for x, a in zip(self.leaves, self.is_array, strict=True))
        return Split(self.treedef, leaves, self.is_array)

    def merge(self, arrays: Any) -> Any:
        it = iter(arrays)
        full = [next(it) if a else x for x, a in zip(self.leaves, self.is_array, strict=True)]
        return jax.tree_util.tree_unflatten(self.treedef, full)


def split(tree: Any) -> Split:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return Split(treedef, tuple(leaves), tuple(bool(eqx.is_array(x)) for x in leaves))


def signature(parts: Split) -> tuple[Any, ...]:
    """A hashable key of a call: the tree structure, array shapes/dtypes and static leaves."""
    key: list[Any] = [parts.treedef]
    for leaf, is_array in zip(parts.leaves, parts.is_array, strict=True):
        if is_array:
            key.append((tuple(leaf.shape), leaf.dtype))  # called per call: kept cheap
        else:
            try:
                hash(leaf)
                key.append(("static", leaf))
            except TypeError:
                key.append(("static-id", id(leaf)))
    # A collective over a named axis (BatchNorm's mean over vmap's "batch") is traced with
    # the axis size as a constant: a trace under a vmap of another size must not be reused.
    key.append(("axes", _compat.named_axes()))
    return tuple(key)


def trace_jaxpr(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Traced:
    """Trace ``model(*args, **kwargs)`` with module and activation markers."""
    check_arguments(model, _model_name(model), args, kwargs, _describe_call(args, kwargs))
    parts = split((model, args, kwargs))
    if not parts.arrays:
        raise TypeError(
            f"clouseau found no array in {getattr(model, '__name__', type(model).__name__)} nor in "
            "the example arguments: pass example jax/numpy arrays, e.g. trace(model, jnp.zeros((1, 8)))"
        )
    in_names, in_is_param = _input_names(model, args, kwargs)
    modules: list[ModuleEntry] = []
    marks: list[int] = []
    kernels: list[tuple[str, computed_kernels.Attrs]] = []
    out_store: dict[str, Any] = {}

    def traced(*arrays: Any) -> list[Any]:
        m, a, k = parts.merge(arrays)
        tree = (_swap_activation_leaves(m), a, k)
        before = state.snapshot(tree)
        registry, objects = _find_modules(tree[0], modules)
        marks.clear()
        kernels.clear()
        with (
            _markers(_Marking(registry, objects, modules, marks)),
            computed_kernels.recording(kernels),
            batch_pin.root(arrays),
        ):
            out = tree[0](*a, **k)
        changed = state.changes(tree, before)
        out_parts = split(out)
        out_store["out"], out_store["state"] = out_parts, changed
        return [*out_parts.arrays, *state.carried(tree, changed)]

    try:
        avals = [jax.ShapeDtypeStruct(np.shape(a), jax.numpy.result_type(a)) for a in parts.arrays]
        closed = batch_pin.make_jaxpr(traced, avals)
    except (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerBoolConversionError,
        jax.errors.TracerIntegerConversionError,
        jax.errors.TracerArrayConversionError,
    ) as err:
        raise TraceError(_control_flow_message(err)) from err
    except ClouseauError:
        raise
    except Exception as err:
        # The model's own error on these inputs (shapes, dtypes): say where and with what.
        raise TraceError(_inputs_message(model, parts, err)) from err
    out_parts: Split = out_store["out"]
    state.refuse_shared((model, args, kwargs), out_store["state"])
    return Traced(
        jaxpr=closed,
        in_names=in_names,
        in_is_param=in_is_param,
        modules=tuple(modules),
        root_type=type(model).__name__,
        out=out_parts.static(),
        name=getattr(model, "__name__", type(model).__name__),
        state=out_store["state"],
        marks=tuple(marks),
        kernels=tuple(kernels),
    )


@dataclass(frozen=True)
class _Marking:
    """The module markers of one trace: submodule ids, their entries, state per call."""

    registry: dict[int, int]  # id(submodule) -> index into modules
    objects: list[Any]  # keeps the ids valid during the trace
    modules: list[ModuleEntry]
    marks: list[int]  # per marker call: the number of its outputs that are state


def _input_names(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    try:
        params = list(inspect.signature(model).parameters)
    except (TypeError, ValueError):
        params = []
    positional = [p for p in params if p not in kwargs]
    # A linen model.apply's first argument is the model's variables: its state, as an
    # Equinox module's leaves are, not points written again on every call.
    variables = 0 if is_linen_apply(model) else None
    names: list[str] = []
    is_param: list[bool] = []
    for keys, leaf in jax.tree_util.tree_flatten_with_path((model, args, kwargs))[0]:
        if not eqx.is_array(leaf):
            continue
        where, rest = keys[0].idx, keys[1:]
        if where == 1 and rest[0].idx == variables:
            names.append(path_name(rest[1:]) or "param")
            is_param.append(True)
            continue
        if where == 0:
            names.append(path_name(rest) or "param")
            is_param.append(True)
            continue
        if where == 1:
            index = rest[0].idx
            head = positional[index] if index < len(positional) and params else f"arg{index}"
        else:
            head = key_name(rest[0])
        names.append(join(head, path_name(rest[1:])))
        is_param.append(False)
    return tuple(names), tuple(is_param)


def _is_module(node: Any) -> bool:
    if inspect.isfunction(node) or inspect.ismethod(node) or isinstance(node, (list, tuple, dict)):
        return False
    return callable(node) and "__call__" in _class_attrs(type(node))


def _class_attrs(cls: type) -> set[str]:
    return {k for c in cls.__mro__ if c is not object for k in vars(c)}


def _find_modules(model: Any, found: list[ModuleEntry]) -> tuple[dict[int, int], list[Any]]:
    """Map id(submodule) -> index into ``found`` (filled in pytree order, root excluded).

    The submodule objects are returned too: they keep the ids valid during the trace.
    """
    registry: dict[int, int] = {}
    objects: list[Any] = []
    found.clear()

    def walk(node: Any, path: str) -> None:
        children = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
        for keys, child in children:
            if child is node or jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(child)):
                continue
            child_path = join(path, path_name(keys))
            if _is_module(child) and id(child) not in registry:
                size = sum(
                    int(np.size(x)) for x in jax.tree_util.tree_leaves(child) if eqx.is_array(x)
                )
                registry[id(child)] = len(found)
                objects.append(child)
                found.append(ModuleEntry(child_path, type(child).__name__, size))
            walk(child, child_path)

    walk(model, "")
    return registry, objects


def _structured() -> dict[str, Callable[..., Any]]:
    """The activations JAX leaves structure for (jit, custom_jvp): ``jax.nn`` name -> function.

    The plain ones (gelu, softmax) are marked by identity (:mod:`.activations`).
    """
    return {
        n: getattr(jax.nn, n)
        for n in ACTIVATIONS
        if hasattr(jax.nn, n) and getattr(jax.nn, n) not in activations.PLAIN.values()
    }


_STRUCTURED = _structured()


def _swap_activation_leaves(model: Any) -> Any:
    wrapped = {id(fn): _activation_wrapper(fn) for fn in _STRUCTURED.values()}
    return jax.tree_util.tree_map(lambda x: wrapped.get(id(x), x) if callable(x) else x, model)


def _activation_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
    # Named by the function, not the attribute: jax.nn.swish is silu.
    name = getattr(fn, "__name__", "activation")

    def activation(*args: Any, **kwargs: Any) -> Any:
        return _mark_activation(name, fn, args, kwargs)

    activation.__name__ = name
    activation.__wrapped__ = fn  # type: ignore[attr-defined]
    return activation


def _mark_activation(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if getattr(_local, "in_activation", False):
        return fn(*args, **kwargs)
    if name in computed_kernels.KERNELS:  # its softmax inside stays marked
        arrays = split((args, kwargs)).arrays
        return computed_kernels.call(name, fn, args, kwargs, arrays, call_marked)
    _local.in_activation = True
    try:
        return call_marked(FN_MARK + name, fn, args, kwargs)
    finally:
        _local.in_activation = False


@contextmanager
def _markers(marking: _Marking) -> Iterator[None]:
    """Patch module classes' ``__call__`` and mark ``jax.nn`` activations for one trace."""
    with _PATCH_LOCK:
        classes = {type(obj) for obj in marking.objects}
        saved_calls = {cls: cls.__dict__.get("__call__") for cls in classes}
        originals = {cls: cls.__call__ for cls in classes}
        saved_nn = _STRUCTURED
        try:
            for cls in classes:
                cls.__call__ = _module_wrapper(originals[cls], marking)  # type: ignore[method-assign]
            for n, fn in saved_nn.items():
                setattr(jax.nn, n, _activation_wrapper(fn))
            with activations.swapped(_mark_activation):
                yield
        finally:
            for n, fn in saved_nn.items():
                setattr(jax.nn, n, fn)
            for cls, own in saved_calls.items():
                if own is None:
                    delattr(cls, "__call__")
                else:
                    cls.__call__ = own  # type: ignore[method-assign]


def _module_wrapper(original: Callable[..., Any], marking: _Marking) -> Callable[..., Any]:
    registry, objects = marking.registry, marking.objects

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        index = registry.get(id(self))
        if index is None or getattr(_local, "in_activation", False):
            return original(self, *args, **kwargs)
        mark = len(marking.marks)
        marking.marks.append(0)
        found: dict[str, tuple[int, ...]] = {}

        def rebuilt(new_self: Any, *a: Any, **k: Any) -> Any:
            # Inside the marker jit the module is rebuilt from traced leaves: its
            # submodules are new objects, registered here under their old paths.
            for old, new in zip(_descendants(self), _descendants(new_self), strict=True):
                if id(old) in registry:
                    registry[id(new)] = registry[id(old)]
                    objects.append(new)
            tree = (new_self, a, k)
            before = state.snapshot(tree)
            out = original(new_self, *a, **k)
            # What the module assigns (BatchNorm statistics, an Rngs count) leaves the
            # marker as outputs after the module's own, to be assigned outside it.
            found["state"] = changed = state.changes(tree, before, marking.modules[index].path)
            marking.marks[mark] = len(changed)
            return out, state.carried(tree, changed)

        name = f"{MODULE_MARK}{index}_{mark}"
        out, values = call_marked(name, rebuilt, (self, *args), kwargs)
        state.write_back((self, args, kwargs), found["state"], values)
        return out

    return __call__


def _descendants(node: Any) -> list[Any]:
    found: list[Any] = []
    for child in jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)[0]:
        if child is node or jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(child)):
            continue
        found.append(child)
        found.extend(_descendants(child))
    return found


def call_marked(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Call ``fn`` through a ``jax.jit`` called ``name``, so its outputs are one equation's.

    Called under the model's own ``jax.vmap`` (``jax.vmap(self.query_proj)(q)``), the
    outputs are pinned batch axis first, as an eager ``jax.vmap`` of ``fn`` returns them.
    """
    parts = split((args, kwargs))
    store: dict[str, Split] = {}
    pin = batch_pin.for_call(parts.arrays)

    def inner(*arrays: Any) -> list[Any]:
        a, k = parts.merge(arrays)
        with batch_pin.inside(pin, arrays):
            out = split(fn(*a, **k))
        store["out"] = out
        return batch_pin.pinned_outputs(pin, list(out.arrays), arrays)

    inner.__name__ = inner.__qualname__ = name
    results = jax.jit(inner)(*parts.arrays)
    return store["out"].merge(results)


def _control_flow_message(err: BaseException) -> str:
    frame = _user_frame_of(err)
    where = (
        f"{frame.filename}:{frame.lineno} ({frame.name}): {(frame.line or '').strip()}"
        if frame
        else "the model"
    )
    kind = type(err).__name__
    return (
        f"value-dependent Python control flow at {where}. clouseau traces the model once per "
        f"input signature with abstract arrays, so Python `if`/`while`/`bool()`/`int()` on an "
        f"array value cannot be followed ({kind}). Use jax.lax.cond or jnp.where (loops: "
        f"jax.lax.while_loop, fori_loop or scan) instead, or pass the value as a static "
        f"(non-array) argument."
    )


def _model_name(model: Any) -> str:
    return str(getattr(model, "__name__", type(model).__name__))


def _describe_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    def one(value: Any) -> str:
        if eqx.is_array(value):
            return f"{jax.numpy.result_type(value)}{list(np.shape(value))}"
        return describe_other(value)

    def tree(value: Any) -> str:
        leaves = jax.tree_util.tree_leaves(value)
        if len(leaves) == 1 and leaves[0] is value:
            return one(value)
        return str(jax.tree_util.tree_map(one, value))

    return describe_call(args, kwargs, tree)


def _inputs_message(model: Any, parts: Split, err: BaseException) -> str:
    frame = _user_frame_of(err)
    at = f" at {frame.filename}:{frame.lineno} ({(frame.line or '').strip()})" if frame else ""
    _, args, kwargs = parts.merge(parts.arrays)
    described = _describe_call(args, kwargs)
    return inputs_rejected(
        _model_name(model), described, at, f": {first_line(err)}", expects="parameters"
    )


def _user_frame_of(err: BaseException) -> traceback.FrameSummary | None:
    """The innermost user frame of ``err``'s traceback, else the user's call (the stack)."""
    return user_frame(err, _compat.is_library_file, or_stack=True)
