"""The JAX / Equinox frontend: trace a function or callable pytree to the IR, and instrument it.

>>> from clouseau.capture import jax as cj
>>> graph = cj.trace(model, x)                      # verified IR Graph (frontend JAX)
>>> fmodel = cj.instrument(model, select="relu*", sink=sink)
>>> y = fmodel(x)                                   # same outputs; saves go to the sink

The pipeline, one module a stage (``README.md`` beside this file maps it in full):
:mod:`.jaxpr_trace` traces with ``jax.make_jaxpr`` and module and activation markers
(:mod:`.activations`, :mod:`.state`, :mod:`.batch_pin`); :mod:`.build` flattens the jaxpr
into one IR graph, named as :mod:`.naming` documents, keyed as :mod:`.keys` says;
:mod:`.plan` places the saves of the instrumented graph; :mod:`.lower` builds the runnable
functions, which rerun the jaxpr with :mod:`.interpret` (and :mod:`.intervene` for
interventions and gradients) and hand the values to the sink through :mod:`.receivers`;
:mod:`.module` is the instrumented model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax

from clouseau.capture.jax._compat import distributed_client
from clouseau.capture.jax.build import build_graph
from clouseau.capture.jax.jaxpr_trace import Traced, split, trace_jaxpr
from clouseau.capture.jax.linen import refuse_linen
from clouseau.capture.jax.module import Core, InstrumentedFunction, InstrumentedModule
from clouseau.capture.jax.naming import ACTIVATIONS, TORCH_KEY_MAP, map_keys, path_name
from clouseau.capture.jax.plan import Plan, make_plan
from clouseau.ir.graph import Graph
from clouseau.ir.passes import insert_saves
from clouseau.ir.selection import SelectLike, check_select
from clouseau.ir.sink import Sink

__all__ = [
    "ACTIVATIONS",
    "FRONTEND",
    "TORCH_KEY_MAP",
    "InstrumentedFunction",
    "InstrumentedModule",
    "JaxFrontend",
    "Lowered",
    "instrument",
    "lower",
    "map_keys",
    "trace",
]


def trace(model: Any, *args: Any, **kwargs: Any) -> Graph:
    """Trace ``model(*args, **kwargs)`` into a verified IR graph.

    Parameters
    ----------
    model
        A JAX function, an Equinox module, or any callable pytree with ``jax.Array`` leaves.
    *args, **kwargs
        Example arguments; arrays are traced by shape and dtype, anything else is static.

    Returns
    -------
    Graph
        The graph (frontend ``jax``), one node per operation, with module outputs as aliases.

    Raises
    ------
    TypeError
        If ``model`` is not callable, or neither it nor the arguments hold an array.
    clouseau.ir.errors.TraceError
        If the model branches in Python on an array value.
    """
    _check_model(model)
    return build_graph(trace_jaxpr(model, args, kwargs))


def instrument(
    model: Any, *, select: SelectLike, sink: Sink, intervene: Any = None, grads: Any = False
) -> InstrumentedModule | InstrumentedFunction:
    """Wrap ``model`` so that calling it also saves the selected points to ``sink``.

    Parameters
    ----------
    model
        A JAX function, an Equinox module, or any callable pytree with ``jax.Array`` leaves.
    select
        What to save (see :mod:`clouseau.ir.selection`); ``None`` saves nothing and calls
        the model unchanged. A selection that matches nothing raises SelectionError on the
        first call.
    sink
        Receives the graph once per input signature, then the saved values of every call.
    intervene
        ``{pattern: action}`` (see :mod:`clouseau.ir.actions`): the values that the rest
        of the model, and the saves, see changed; under ``jit``, ``vmap``, ``grad`` too.
    grads
        True (the points of ``select``) or a selection: save the gradient of each point
        as ``<name>.grad`` when the model is differentiated (see docs/interventions.md).

    Returns
    -------
    InstrumentedModule or InstrumentedFunction
        Callable like ``model``; a pytree (an ``eqx.Module``) when ``model`` has array
        leaves; a capture session (``close()``, ``with``, ``captured``).
    """
    # An invalid glob or select type fails now, not at the model's first call.
    check_select(select)
    return FRONTEND.instrument(model, select=select, sink=sink, intervene=intervene, grads=grads)


@dataclass(frozen=True)
class Lowered:
    """What an exporter needs to rebuild the instrumented computation elsewhere (ONNX).

    The frontend's lowering for exporters (:func:`lower`); the runnable lowering of an
    instrumented model is :class:`clouseau.capture.jax.lower.Runnable`.

    ``traced.jaxpr`` is the closed jaxpr whose invars are ``arrays`` (the array leaves of
    ``(model, args, kwargs)``, named by ``traced.in_names``); ``graph`` is its IR with the
    save nodes; ``plan.slots`` say at which equation (key, output) each saved value lies.
    """

    traced: Traced
    graph: Graph
    plan: Plan
    arrays: tuple[Any, ...]


def lower(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], select: SelectLike) -> Lowered:
    """Trace ``model(*args, **kwargs)`` and insert the saves of ``select``, for exporters."""
    _check_model(model)
    traced = trace_jaxpr(model, args, kwargs)
    graph = insert_saves(build_graph(traced), select)
    return Lowered(traced, graph, make_plan(graph), split((model, args, kwargs)).arrays)


class JaxFrontend:
    """The JAX / Equinox frontend as a :class:`clouseau.capture.Frontend`."""

    name = "jax"

    def trace(self, model: Any, *args: Any, **kwargs: Any) -> Graph:
        return trace(model, *args, **kwargs)

    def instrument(
        self,
        model: Any,
        *,
        select: SelectLike,
        sink: Sink,
        intervene: Any = None,
        grads: Any = False,
    ) -> InstrumentedModule | InstrumentedFunction:
        # select was checked by the caller (the public API, or instrument above).
        _check_model(model)
        core = Core(sink, select, intervene=intervene, grads=grads)
        if isinstance(model, eqx.Module) or _has_arrays(model):
            return InstrumentedModule(model, core)
        return InstrumentedFunction(model, core)

    def lower(
        self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], select: SelectLike
    ) -> Lowered:
        return lower(model, args, kwargs, select)

    def children(self, node: Any) -> Iterator[tuple[str, Any]]:
        # Keyed as the tracer spells module paths, so that a path here is the IR's.
        found = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)[0]
        for keys, child in found:
            if child is node:  # a pytree leaf flattens to itself: it has no children
                return
            yield path_name(keys), child

    def backend(self, select: SelectLike, sink: Sink, *, compiler: Any, intervene: Any) -> Any:
        raise TypeError(
            "clouseau.backend is a torch.compile backend: for a JAX model use "
            "clouseau.instrument(model, select=...), which also works inside jax.jit"
        )

    def distributed_client(self) -> Any:
        return distributed_client()


FRONTEND = JaxFrontend()


def _check_model(model: Any) -> None:
    refuse_linen(model)
    if not callable(model):
        raise TypeError(
            f"clouseau cannot trace a {type(model).__name__}: pass a JAX function, an Equinox "
            "module, or a callable pytree holding jax.Array leaves"
        )


def _has_arrays(tree: Any) -> bool:
    return any(eqx.is_array(x) for x in jax.tree_util.tree_leaves(tree))
