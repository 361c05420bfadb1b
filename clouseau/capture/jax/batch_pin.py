"""Pin the outputs of a module the model itself calls under ``jax.vmap`` batch axis first.

A marked call (see :mod:`~clouseau.capture.jax.jaxpr_trace`) made under the model's own
``jax.vmap`` (Equinox's ``MultiheadAttention`` vmaps its projections) would hold the layout
JAX's batching rule chose (``weight @ x`` batched puts the batch axis last). Its outputs go
through an identity built with ``jax.custom_batching.custom_vmap`` inside the marker jit,
whose rule returns the batched values as custom_vmap hands them (batch axis first):
batching replaces the pin by that transpose, so the point holds what an eager ``jax.vmap``
of the call returns. Outside vmap nothing is added (custom_vmap has no reverse-mode rule),
and a trace that leaves a pin unbatched is redone without it (:func:`make_jaxpr`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.extend as jex

from clouseau.capture.jax import _compat

_local = threading.local()


@dataclass(frozen=True)
class Pin:
    """What one marked call pins: how many vmaps, and which inputs make them batch it."""

    levels: int
    call: int
    anchors: tuple[int, ...]
    in_frame: bool


def for_call(arrays: Sequence[Any]) -> Pin:
    """The pin of a marked call on ``arrays`` in the trace being made now."""
    plan: PinPlan = getattr(_local, "plan", None) or PinPlan(direct=False, nested=False)
    frame: Frame = getattr(_local, "frame", None) or Frame()
    call = next(plan.calls)
    in_frame = plan.nested and frame.holds(arrays)
    own, anchors = _own_vmaps(arrays, in_frame) if plan.direct else (0, ())
    levels = 0 if call in plan.skip else own + (frame.levels if in_frame else 0)
    return Pin(levels, call, anchors, in_frame)


@contextmanager
def inside(pin: Pin, arrays: Sequence[Any]) -> Iterator[None]:
    """The frame of the marked call's own trace (its jit's inner function)."""
    trace = _compat.base_trace(arrays[0]) if pin.in_frame and arrays else None
    with _frame(Frame(pin.levels, trace)):
        yield


@contextmanager
def root(arrays: Sequence[Any]) -> Iterator[None]:
    """The frame of the model's own trace."""
    with _frame(Frame(0, _compat.base_trace(arrays[0]) if arrays else None)):
        yield


def pinned_outputs(pin: Pin, outputs: list[Any], arrays: Sequence[Any]) -> list[Any]:
    return _pinned(_PinRule(pin.levels, pin.call), outputs, tuple(arrays[i] for i in pin.anchors))


def _own_vmaps(arrays: Sequence[Any], retraced: bool) -> tuple[int, tuple[int, ...]]:
    """How many vmaps batch the inputs of a call, and which inputs to give its pin.

    Those inputs make every one of these vmaps batch the pin, even when no output depends
    on the batched inputs. The pin's batching moves each batched input's axis to the front:
    a dead transpose in the graph unless that axis is 0. So inputs batched along axis 0
    are given if they suffice; else none where a pin left unbatched is traced again
    (``retraced``: the call is in a trace of ours, see Frame), else all batched inputs.
    """
    axes = [_compat.batch_axes(x) for x in arrays]
    vmaps = {v for a in axes for v in a}
    front = tuple(i for i, a in enumerate(axes) if a and set(a.values()) == {0})
    if {v for i in front for v in axes[i]} == vmaps:
        return len(vmaps), front
    return len(vmaps), () if retraced else tuple(i for i, a in enumerate(axes) if a)


@dataclass(frozen=True)
class PinPlan:
    """Which marked calls of one trace pin their outputs batch axis first (:func:`_pinned`)."""

    direct: bool = True  # calls made under a vmap that they see (their inputs are batched)
    nested: bool = True  # calls inside a marked call made under a vmap (see Frame)
    skip: frozenset[int] = frozenset()  # calls whose pins were left unbatched last time
    calls: Iterator[int] = field(default_factory=itertools.count, compare=False)  # numbers them

    def fallback(self, left: frozenset[int]) -> PinPlan:
        """The next plan when the pins of the calls ``left`` stayed in the jaxpr."""
        if self.nested and not self.skip:
            return PinPlan(skip=left)
        return PinPlan(direct=self.nested, nested=False)


@dataclass(frozen=True)
class Frame:
    """The marked call being traced: the vmaps that will batch it, and its jit's trace.

    A submodule of a module called under vmap is traced inside that module's marker jit on
    unbatched values: it cannot see the vmap, which batches it all the same. Only calls made
    directly in that (fresh, never reused) trace inherit ``levels``: behind a user's jit,
    scan or checkpoint, whose traces JAX caches and may reuse where nothing is batched, a
    pin could stay unbatched for good.
    """

    levels: int = 0
    trace: Any = None

    def holds(self, arrays: Sequence[Any]) -> bool:
        """True when a call on ``arrays`` is made directly in this frame's trace."""
        traces = [_compat.base_trace(x) for x in arrays]
        return self.trace is not None and all(t is None or t is self.trace for t in traces)


@contextmanager
def _frame(frame: Frame) -> Iterator[None]:
    with _thread_local(frame=frame):
        yield


@contextmanager
def _thread_local(**values: Any) -> Iterator[None]:
    saved = {k: getattr(_local, k, None) for k in values}
    for k, v in values.items():
        setattr(_local, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(_local, k, v)


@dataclass(frozen=True)
class _PinRule:
    """The vmap rule of a pin: the batched values as they come, batch axis first."""

    levels: int
    call: int  # the marked call (in trace order) whose outputs are pinned

    def __call__(
        self, axis_size: int, in_batched: list[Any], values: list[Any], anchors: tuple[Any, ...]
    ) -> tuple[list[Any], list[bool]]:
        # The outer vmaps, batched after this one, pin again: their axes go in front.
        return _pinned(replace(self, levels=self.levels - 1), values, anchors), in_batched[0]


def _pinned(rule: _PinRule, values: list[Any], anchors: tuple[Any, ...]) -> list[Any]:
    """``values`` unchanged, but each of ``rule.levels`` vmaps batching them puts its axis first.

    custom_vmap hands its rule the batched operands with the batch axis moved to the front
    and the rule returns them as they are, so batching replaces the pin by that transpose:
    the layout of an eager ``jax.vmap``. ``anchors`` (batched inputs of the call) only make
    sure that the pin is batched. Outside vmap nothing is added: custom_vmap has no
    reverse-mode rule, and a pin that no vmap batches stays in the jaxpr.
    """
    if not rule.levels or not values:
        return values
    pin = jax.custom_batching.custom_vmap(_identity)
    pin.def_vmap(rule)
    return list(pin(values, anchors))


def _identity(values: list[Any], anchors: tuple[Any, ...]) -> list[Any]:
    return values


def make_jaxpr(fn: Callable[..., Any], avals: list[Any]) -> Any:
    """``jax.make_jaxpr(fn)(*avals)`` with vmapped marked calls pinned batch axis first.

    A pin stays in the jaxpr, unbatched, when no batched value reaches it at some vmap
    level (a submodule of a vmapped module that does not depend on the batched inputs).
    Then the trace is redone without pinning those calls; should pins still be left (calls
    numbered differently), without inherited pins and with every direct pin given its
    batched inputs (then none can stay), and at last without any pin.
    """
    plan = PinPlan()
    while True:
        with _thread_local(plan=plan):
            # A fresh function each time: make_jaxpr caches traces by function.
            closed = jax.make_jaxpr(lambda *a: fn(*a))(*avals)
        left = frozenset(_pins_left(closed.jaxpr))
        if not left or not plan.direct:
            return closed
        plan = plan.fallback(left)


def _pins_left(jaxpr: Any) -> Iterator[int]:
    """The calls (:attr:`_PinRule.call`) whose pins are still in ``jaxpr``."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "custom_vmap_call":
            rule = getattr(eqn.params.get("rule"), "__wrapped__", None)
            if isinstance(rule, _PinRule):
                yield rule.call
        for sub in _subjaxprs(eqn.params):
            yield from _pins_left(sub)


def _subjaxprs(params: dict[str, Any]) -> Iterator[Any]:
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jex.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex.core.Jaxpr):
                yield item
