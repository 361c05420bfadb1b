"""The jaxpr interpreter: re-evaluate a traced jaxpr, opening the sub-jaxprs that hold saves.

Each equation is re-bound as ``jax.core.eval_jaxpr`` does, so the computation is the
model's. An equation whose sub-jaxpr holds a save (or a rewrite) is rebuilt around the
interpreted body, so the saved values can leave it:

- ``jit``: inlined.
- ``remat``: rebuilt with ``jax.checkpoint``; the body also returns its saved values.
- ``scan``: rebuilt with ``jax.lax.scan``; the body's saved values are stacked outputs
  (one leading axis per enclosing scan).
- ``cond``: rebuilt with ``jax.lax.switch``; every branch returns the saved values of all
  branches (zeros for another branch's), and the branch index is kept as a hidden slot so
  that the host keeps only what the taken branch computed.
- ``while``: rebuilt with ``jax.lax.while_loop`` and an iteration counter; values inside
  the body exist a data-dependent number of times, so each iteration streams them to the
  host in one callback, numbered by the call and by the iterations of enclosing loops.
- ``custom_jvp`` / ``custom_vjp``: the equation is bound as it is (its derivative rule is
  kept) and the body is run once more on ``stop_gradient`` inputs for the saved values;
  a rewrite inside the body (an intervention) replaces the call by its body.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from clouseau.capture.jax import _compat
from clouseau.capture.jax.keys import (
    CALLS,
    CUSTOM,
    REMAT,
    body_key,
    branch_key,
    cond_key,
    const_key,
    count_key,
    equation_key,
    index_key,
    input_key,
)
from clouseau.capture.jax.plan import Plan
from clouseau.ir.errors import TraceError

# emit(while key, call index, iteration counters, the while's streamed values)
Emit = Callable[[str, Any, tuple[Any, ...], list[Any]], None]


@dataclass(frozen=True)
class Stream:
    """Where the values of ``while`` bodies go: the call index, the enclosing counters."""

    call: Any = None
    emit: Emit | None = None
    counters: tuple[Any, ...] = ()

    def enter(self, counter: Any) -> Stream:
        return replace(self, counters=(*self.counters, counter))


def run(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    key: str,
    plan: Plan,
    saved: dict[int, Any],
    stream: Stream = Stream(),
) -> list[Any]:
    """Evaluate ``jaxpr``, putting the values of ``plan``'s slots under ``key`` in ``saved``."""
    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return var.val if type(var).__name__ == "Literal" else env[var]

    def bind(where: str, var: Any, value: Any) -> None:
        env[var] = value = plan.rewrite(where, [value], (), saved)[0]
        plan.record(where, [value], saved)

    for i, (var, value) in enumerate(zip(jaxpr.constvars, consts, strict=True)):
        bind(const_key(key, i), var, value)
    for i, (var, value) in enumerate(zip(jaxpr.invars, args, strict=True)):
        bind(input_key(key, i), var, value)
    for position, eqn in enumerate(jaxpr.eqns):
        ekey = equation_key(key, position)
        invals = [read(v) for v in eqn.invars]
        if plan.inside(ekey):
            outs = _open(eqn, ekey, invals, plan, saved, stream)
        else:
            outs = _compat.bind_equation(eqn, invals)
        # Interventions and gradient taps of this equation; a decomposed kernel's rewrite
        # appends what only slots read.
        outs = plan.rewrite(ekey, outs, invals, saved)
        for var, value in zip(eqn.outvars, outs[: len(eqn.outvars)], strict=True):
            env[var] = value
        plan.record(ekey, outs, saved)
    return [read(v) for v in jaxpr.outvars]


class _Opening(NamedTuple):
    """An equation being opened: its key, its inputs, and where its saves go."""

    key: str
    invals: list[Any]
    plan: Plan
    saved: dict[int, Any]
    stream: Stream


def _open(
    eqn: Any, key: str, invals: list[Any], plan: Plan, saved: dict[int, Any], stream: Stream
) -> list[Any]:
    prim = eqn.primitive.name
    at = _Opening(key, invals, plan, saved, stream)
    if prim in CALLS:
        inner = eqn.params["jaxpr"]
        return run(inner.jaxpr, inner.consts, invals, key, plan, saved, stream)
    opener = _OPENERS.get(prim)
    if opener is not None:
        return opener(eqn.params, at)
    if prim in CUSTOM:
        return _open_custom(eqn, at)
    raise TraceError(f"clouseau cannot save a value computed inside {prim} (at equation {key})")


def _collecting(
    jaxpr: Any, consts: Sequence[Any], key: str, plan: Plan, stream: Stream, ids: list[int]
) -> Callable[..., tuple[list[Any], list[Any]]]:
    """The body as a function returning its outputs and the saved values it computed.

    ``ids`` is filled with the slot ids of those values when the body is traced.
    """

    def body(*args: Any) -> tuple[list[Any], list[Any]]:
        local: dict[int, Any] = {}
        outs = run(jaxpr, consts, args, key, plan, local, stream)
        ids[:] = sorted(local)
        return outs, [local[i] for i in ids]

    return body


def _open_remat(params: dict[str, Any], at: _Opening) -> list[Any]:
    key, invals, plan, saved, stream = at
    ids: list[int] = []
    body = _collecting(params["jaxpr"], (), key, plan, stream, ids)
    outs, values = jax.checkpoint(body, prevent_cse=params["prevent_cse"], policy=params["policy"])(
        *invals
    )
    saved.update(zip(ids, values, strict=True))
    return list(outs)


def _open_scan(params: dict[str, Any], at: _Opening) -> list[Any]:
    key, invals, plan, saved, stream = at
    closed = params["jaxpr"]
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    consts, init = invals[:n_consts], invals[n_consts : n_consts + n_carry]
    xs = invals[n_consts + n_carry :]
    counted = plan.streams_inside(key)  # a while inside needs this scan's iteration number
    ids: list[int] = []

    def body(carry: tuple[Any, list[Any]], x: list[Any]) -> Any:
        i, values = carry
        inner = stream.enter(i) if counted else stream
        outs, local = _collecting(closed.jaxpr, closed.consts, key, plan, inner, ids)(
            *consts, *values, *x
        )
        return (i + 1, outs[:n_carry]), (outs[n_carry:], local)

    (_, carry), (ys, values) = jax.lax.scan(
        body,
        (jnp.int32(0), list(init)),
        list(xs),
        length=params["length"],
        reverse=params["reverse"],
        unroll=params["unroll"],
    )
    saved.update(zip(ids, values, strict=True))
    return [*carry, *ys]


def _open_cond(params: dict[str, Any], at: _Opening) -> list[Any]:
    key, invals, plan, saved, stream = at
    index, operands = invals[0], invals[1:]
    ids = plan.collected_inside(key)  # the same outputs from every branch

    def branch(b: int, closed: Any) -> Callable[..., tuple[list[Any], list[Any]]]:
        def fn(*args: Any) -> tuple[list[Any], list[Any]]:
            local: dict[int, Any] = {}
            outs = run(closed.jaxpr, closed.consts, args, branch_key(key, b), plan, local, stream)
            return outs, [local.get(i) for i in ids]

        return fn

    branches = [branch(b, closed) for b, closed in enumerate(params["branches"])]
    # A value another branch computes is a placeholder of its shape here (never kept).
    shapes = [jax.eval_shape(fn, *operands)[1] for fn in branches]
    placeholders = [next(s[j] for s in shapes if s[j] is not None) for j in range(len(ids))]

    def filled(fn: Callable[..., Any]) -> Callable[..., Any]:
        def out(*args: Any) -> tuple[list[Any], list[Any]]:
            outs, values = fn(*args)
            return outs, [
                jnp.zeros(p.shape, p.dtype) if v is None else v
                for v, p in zip(values, placeholders, strict=True)
            ]

        return out

    outs, values = jax.lax.switch(index, [filled(fn) for fn in branches], *operands)
    saved.update(zip(ids, values, strict=True))
    plan.record(index_key(key), [index], saved)
    return list(outs)


def _open_while(params: dict[str, Any], at: _Opening) -> list[Any]:
    key, invals, plan, saved, stream = at
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts = invals[:n_cond], invals[n_cond : n_cond + n_body]
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    streamed = plan.streamed_by(key)

    def cond_fn(carry: tuple[Any, list[Any]]) -> Any:
        return run(cond.jaxpr, cond.consts, [*cond_consts, *carry[1]], cond_key(key), plan, {})[0]

    def body_fn(carry: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
        i, values = carry
        inner = stream.enter(i)
        local: dict[int, Any] = {}
        outs = run(
            body.jaxpr, body.consts, [*body_consts, *values], body_key(key), plan, local, inner
        )
        if streamed:
            if stream.emit is None:
                raise TraceError(f"clouseau has no host stream for the while_loop at {key}")
            stream.emit(key, stream.call, inner.counters, [local[s] for s in streamed])
        return i + 1, outs

    count, outs = jax.lax.while_loop(cond_fn, body_fn, (jnp.int32(0), invals[n_cond + n_body :]))
    # The trip count makes the call's last delivery wait for this loop's streamed values.
    plan.record(count_key(key), [count], saved)
    return list(outs)


def _open_custom(eqn: Any, at: _Opening) -> list[Any]:
    key, invals, plan, saved, stream = at
    closed = eqn.params["call_jaxpr"]
    if plan.rewrites_inside(key):
        # An intervention inside changes the function: its custom rule no longer applies.
        return run(closed.jaxpr, closed.consts, invals, key, plan, saved, stream)
    primal = [jax.lax.stop_gradient(x) for x in invals]
    run(closed.jaxpr, closed.consts, primal, key, plan, saved, stream)
    return _compat.bind_equation(eqn, invals)


_OPENERS: dict[str, Callable[[dict[str, Any], _Opening], list[Any]]] = {
    **dict.fromkeys(sorted(REMAT), _open_remat),
    "scan": _open_scan,
    "cond": _open_cond,
    "while": _open_while,
}
