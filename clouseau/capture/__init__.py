"""Framework frontends: trace a model into the IR, and lower an instrumented IR back.

Each frontend package (``clouseau.capture.torch``, ``clouseau.capture.jax``) has a
``FRONTEND`` object that is a :class:`Frontend`; :func:`frontend_for` picks the one of a
model, :func:`frontend_named` the one of a framework. The protocol is the only door into a
frontend: no module outside ``clouseau.capture.<framework>`` imports its submodules
(``tests/test_layering.py``). What the frontends share lives in ``_common.py`` and
``_session.py``. Frameworks are imported only when a frontend is used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from clouseau.ir.actions import Action
from clouseau.ir.errors import MissingExtraError
from clouseau.ir.graph import Graph
from clouseau.ir.selection import SelectLike
from clouseau.ir.sink import Sink


@runtime_checkable
class Frontend(Protocol):
    """What the public API needs of a framework: trace, instrument, lower, and a name."""

    #: The framework: ``"torch"`` or ``"jax"`` (what exporters dispatch on).
    name: str

    def trace(self, model: Any, *args: Any, **kwargs: Any) -> Graph:
        """The verified IR graph of ``model(*args, **kwargs)``."""
        ...

    def instrument(
        self,
        model: Any,
        *,
        select: SelectLike,
        sink: Sink,
        intervene: Mapping[Any, Action] | None,
        grads: Any,
    ) -> Any:
        """``model`` instrumented to hand the ``select``-ed values of every call to ``sink``.

        The caller has checked ``select`` (``ir.selection.check_select``): it is checked
        once, before the sink opens.
        """
        ...

    def lower(
        self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], select: SelectLike
    ) -> Any:
        """The traced, rewritten and lowered model, for an exporter of this framework."""
        ...

    def children(self, node: Any) -> Iterator[tuple[str, Any]]:
        """The direct submodules of ``node``, each with the path segment the IR gives it."""
        ...

    def backend(
        self,
        select: SelectLike,
        sink: Sink,
        *,
        compiler: str | Callable[..., Any],
        intervene: Mapping[Any, Action] | None,
    ) -> Any:
        """A ``torch.compile`` backend saving ``select`` to ``sink`` (TypeError if none)."""
        ...

    def distributed_client(self) -> Any:
        """The multi-process key-value client of the framework's own runtime, or None.

        None when the runtime is not initialized, or when the framework's processes are
        reached through a public API instead (``torch.distributed``).
        """
        ...


def frontend_for(model: Any, args: tuple[Any, ...] = ()) -> Frontend:
    """The frontend that handles ``model`` (called with ``args``)."""
    if _is_torch(model, args):
        return frontend_named("torch")
    if _is_jax(model, args):
        return frontend_named("jax")
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


def frontend_named(name: str) -> Frontend:
    """The frontend of the framework ``name`` (``"torch"`` or ``"jax"``).

    Raises
    ------
    clouseau.ir.errors.MissingExtraError
        The framework is not installed (the message names the extra to install).
    ValueError
        ``name`` is not a framework clouseau has a frontend for.
    """
    if name not in _FRAMEWORKS:
        raise ValueError(f"no frontend named {name!r}; one of {', '.join(_FRAMEWORKS)}")
    return _load(name, name).FRONTEND  # type: ignore[no-any-return]


_FRAMEWORKS = ("torch", "jax")


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
    linen = sys.modules.get("flax.linen")
    if linen is not None and isinstance(model, linen.Module):
        return True  # the JAX frontend says to instrument its apply function
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
