"""Mark ``jax.nn`` activations by function identity, however the model reaches them.

``jax.nn.gelu`` and ``jax.nn.softmax`` are plain Python functions that JAX inlines: the
jaxpr keeps no trace of them, and a model may hold them under any name
(``from jax.nn import gelu``, an alias, ``flax.nnx.gelu``, a library's module-level
import). For the duration of one trace their code is swapped for a trampoline that calls
:func:`dispatch`, so every call of the function object, by whatever reference, reaches
the marker of the tracing thread; other threads run the original code unchanged.
``jax.nn.dot_product_attention`` is swapped the same way, to be marked as a fused kernel
(:mod:`~clouseau.capture.jax.computed_kernels`).

The other activations of :data:`~clouseau.capture.jax.naming.ACTIVATIONS` leave their
own structure in the jaxpr (a ``jit`` named after the function, a ``custom_jvp_call``, or
the ``logistic`` primitive of ``sigmoid``) and are named from it in
:mod:`~clouseau.capture.jax.build`.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax

from clouseau.capture.jax.computed_kernels import KERNELS
from clouseau.capture.jax.naming import ACTIVATIONS

# handler(name, original function, args, kwargs) -> result
Handler = Callable[[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

_TRAMPOLINE = (
    "def {name}(*args, **kwargs):\n"
    "    return __import__({module!r}, fromlist=['_']).dispatch({name!r}, args, kwargs)\n"
)
_local = threading.local()


@dataclass(frozen=True)
class _Swap:
    """A plain activation function, its own code, and a callable copy of the original."""

    fn: types.FunctionType
    code: types.CodeType
    defaults: tuple[Any, ...] | None
    kwdefaults: dict[str, Any] | None
    original: types.FunctionType
    trampoline: types.CodeType


def _swaps() -> dict[str, _Swap]:
    found: dict[str, _Swap] = {}
    for attr in (*ACTIVATIONS, *KERNELS):
        fn = getattr(jax.nn, attr, None)
        if not isinstance(fn, types.FunctionType) or fn.__closure__ or fn.__name__ in found:
            continue
        original = types.FunctionType(
            fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
        )
        original.__kwdefaults__ = fn.__kwdefaults__
        scope: dict[str, Any] = {}
        exec(_TRAMPOLINE.format(name=fn.__name__, module=__name__), scope)
        found[fn.__name__] = _Swap(
            fn,
            fn.__code__,
            fn.__defaults__,
            fn.__kwdefaults__,
            original,
            scope[fn.__name__].__code__,
        )
    return found


_SWAPS = _swaps()

#: The activations named by identity (plain functions): their name and function object.
PLAIN: dict[str, Callable[..., Any]] = {name: swap.fn for name, swap in _SWAPS.items()}


def dispatch(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a swapped activation runs: the tracing thread's handler, else the original."""
    original = _SWAPS[name].original
    handler: Handler | None = getattr(_local, "handler", None)
    if handler is None:
        return original(*args, **kwargs)
    return handler(name, original, args, kwargs)


@contextmanager
def swapped(handler: Handler) -> Iterator[None]:
    """Route every call of the plain activations on this thread to ``handler``.

    The caller holds the frontend's patch lock: one trace swaps the code at a time.
    """
    _local.handler = handler
    try:
        for swap in _SWAPS.values():
            swap.fn.__code__ = swap.trampoline
            swap.fn.__defaults__ = None
            swap.fn.__kwdefaults__ = None
        yield
    finally:
        for swap in _SWAPS.values():
            swap.fn.__code__ = swap.code
            swap.fn.__defaults__ = swap.defaults
            swap.fn.__kwdefaults__ = swap.kwdefaults
        _local.handler = None
