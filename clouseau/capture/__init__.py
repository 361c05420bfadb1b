"""Framework frontends: trace a model into the IR, and lower an instrumented IR back.

Each frontend (``clouseau.capture.torch``, ``clouseau.capture.jax``) exposes
``trace(model, *args, **kwargs) -> Graph`` and
``instrument(model, *, select, sink) -> instrumented model``. Frameworks are imported only
when a frontend is used.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from clouseau.ir.errors import MissingExtraError


def frontend_for(model: Any, args: tuple[Any, ...] = ()) -> ModuleType:
    """The frontend module that handles ``model`` (called with ``args``)."""
    if _is_torch(model, args):
        return _load("torch", "torch")
    if _is_jax(model, args):
        return _load("jax", "jax")
    if not callable(model):
        raise TypeError(
            f"clouseau cannot trace a {type(model).__name__}: pass a torch.nn.Module, a JAX "
            "function, or an Equinox module (any callable pytree holding jax.Array leaves)"
        )
    raise TypeError(
        f"clouseau cannot tell which framework {type(model).__name__} {getattr(model, '__name__', '')!s} "
        "belongs to: pass a torch.nn.Module, or example arguments that are torch tensors or "
        "jax arrays, with the framework installed (pip install 'clouseau[torch]' or 'clouseau[jax]')"
    )


def _is_torch(model: Any, args: tuple[Any, ...]) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(model, torch.nn.Module):
        return True
    return callable(model) and any(isinstance(a, torch.Tensor) for a in args)


def _is_jax(model: Any, args: tuple[Any, ...]) -> bool:
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    if not callable(model):
        return False
    leaves = jax.tree_util.tree_leaves((model, args))
    return any(isinstance(leaf, jax.Array) for leaf in leaves) or _is_function(model)


def _is_function(model: Any) -> bool:
    import inspect

    return inspect.isfunction(model) or inspect.ismethod(model)


def _load(name: str, extra: str) -> ModuleType:
    try:
        __import__(name)
    except ImportError:
        raise MissingExtraError(name, extra) from None
    import importlib

    return importlib.import_module(f"clouseau.capture.{name}")


def __getattr__(name: str) -> ModuleType:
    # ``clouseau.capture.torch.mark_leaf`` (named in TraceError's fix) works after a plain
    # ``import clouseau``; the framework is imported on this first access, not before.
    if name in ("torch", "jax"):
        return _load(name, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
