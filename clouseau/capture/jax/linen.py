"""Flax linen: a linen module holds no parameters, its ``apply`` function takes them.

``clouseau.instrument(model.apply)`` is how a linen model is captured; the ``variables``
it is called with (``params``, ``batch_stats``, ...) are the model's state, so they are
parameters of the trace (no points), as an Equinox module's leaves are.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any


def is_linen_module(model: Any) -> bool:
    """Whether ``model`` is a ``flax.linen.Module`` (flax is not imported to tell)."""
    linen = sys.modules.get("flax.linen")
    return linen is not None and isinstance(model, linen.Module)


def is_linen_apply(fn: Any) -> bool:
    """Whether ``fn`` is the bound ``apply`` of a linen module: its first argument is the
    model's variables."""
    return inspect.ismethod(fn) and fn.__name__ == "apply" and is_linen_module(fn.__self__)


def refuse_linen(model: Any) -> None:
    """Raise TypeError saying how to capture ``model`` when it is a linen module."""
    if is_linen_module(model):
        name = type(model).__name__
        raise TypeError(
            f"{name} is a Flax linen module, which holds no parameters and runs through "
            "its apply function: instrument model.apply instead, "
            "fmodel = clouseau.instrument(model.apply, select=...), and call it as you call "
            "model.apply, fmodel(variables, x); the variables are parameters, not points"
        )
