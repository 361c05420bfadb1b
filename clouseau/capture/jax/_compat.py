"""The only module of the JAX frontend that touches JAX internals (``jax._src``).

Everything here has a public fallback or is small enough to port when JAX moves it:
evaluating one jaxpr equation the way ``jax.core.eval_jaxpr`` does, reading the user's
frame and the named scopes of an equation's ``source_info``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.extend as jex

_CLOUSEAU_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_EQUINOX_DIR = os.path.dirname(os.path.abspath(__import__("equinox").__file__))
_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__))

# Our wrappers (named scopes, marked jits) must not be reported as the user's code.
jex.source_info_util.register_exclusion(os.path.dirname(os.path.abspath(__file__)))


def bind_equation(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    """Evaluate one jaxpr equation on ``invals`` under the current trace, as eval_jaxpr does."""
    from jax._src import source_info_util

    params = eqn.primitive.get_bind_params(eqn.params)
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with (
        source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
        eqn.ctx.manager,
    ):
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def scope_names(source_info: Any) -> tuple[str, ...]:
    """The user's ``jax.named_scope`` names of an equation, outermost first (no transforms)."""
    stack = getattr(source_info.name_stack, "stack", ())
    names = tuple(getattr(entry, "name", "") for entry in stack if type(entry).__name__ == "Scope")
    return tuple(n for n in names if n)


def user_frame(source_info: Any) -> tuple[str, int, str] | None:
    """(file, line, function) of the user's code that created an equation, if known.

    JAX's own filter skips JAX; we also skip equinox and clouseau so that a layer's
    ops point at the user's model rather than at ``equinox/nn/_linear.py`` where we can.
    """
    from jax._src import source_info_util

    frames = list(source_info_util.user_frames(source_info.traceback))
    for frame in frames:
        if not is_library_file(frame.file_name):
            return frame.file_name, frame.start_line, frame.function_name
    if frames:
        frame = frames[0]
        return frame.file_name, frame.start_line, frame.function_name
    return None


def is_library_file(path: str) -> bool:
    """True for files of JAX, equinox or clouseau (not the user's)."""
    return os.path.abspath(path).startswith((_EQUINOX_DIR, _CLOUSEAU_DIR + os.sep, _JAX_DIR))


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def named_axes() -> tuple[tuple[Any, int], ...]:
    """The named axes bound now (a ``vmap(axis_name=...)`` around the call) and their sizes."""
    from jax._src import core

    return tuple(core.get_axis_env().axis_sizes.items())


def is_batch_tracer(x: Any) -> bool:
    """True when ``x`` is a value being batched by a ``jax.vmap`` (mapped or not)."""
    from jax._src.interpreters import batching

    return isinstance(x, batching.BatchTracer)


def batch_axes(x: Any) -> dict[int, int]:
    """The axis of ``x`` that each ``jax.vmap`` batching it maps, keyed by that vmap's trace."""
    axes: dict[int, int] = {}
    while is_batch_tracer(x):
        if x.batch_dim is not None:  # an unmapped BatchTracer: this vmap does not batch x
            axes[id(x._trace)] = x.batch_dim
        x = x.val
    return axes


def base_trace(x: Any) -> Any:
    """The trace that ``x`` belongs to under the vmaps batching it (None: not a tracer)."""
    while is_batch_tracer(x):
        x = x.val
    return x._trace if isinstance(x, jax.core.Tracer) else None


def distributed_client() -> Any:
    """The coordination-service client of ``jax.distributed.initialize``, or None."""
    from jax._src import distributed

    return distributed.global_state.client
