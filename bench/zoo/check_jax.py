"""The check of one JAX case: the instrumented model against ``jax.jit`` of the original.

Outputs equal ``eqx.filter_jit(run)(model, ...)`` (``jax.jit`` with the model's
non-array leaves static) bitwise, or within :data:`RTOL`/:data:`ATOL`
(XLA fuses the instrumented program, which returns more values, differently: the
tolerance docs/jax.md states); every probe equals its point within the same tolerance;
two calls at two shapes take at most two traces.
"""

from __future__ import annotations

import time
from typing import Any

import equinox as eqx
import jax
import numpy as np

import clouseau
from bench.zoo.jax_models import JaxCase
from bench.zoo.outcome import Outcome, Status, short
from clouseau.ir.errors import ClouseauError

RTOL, ATOL = 1e-5, 1e-6


def run_case(case: JaxCase) -> Outcome:
    started = time.perf_counter()
    outcome = check(case)
    return Outcome(**{**outcome.__dict__, "seconds": round(time.perf_counter() - started, 1)})


def check(case: JaxCase) -> Outcome:
    base = {"family": "jax", "name": case.name, "task": case.kind}
    jitted = eqx.filter_jit(case.run)  # the model is an argument: its non-array leaves static
    expected = [jitted(case.model, *args) for args in case.calls]
    try:
        fmodel = clouseau.instrument(case.model, select="*", path=None)
        got = [case.run(fmodel, *args) for args in case.calls]
        jax.effects_barrier()
    except ClouseauError as error:
        return Outcome(**base, status=Status.REFUSED, detail=short(error))
    except Exception as error:
        return Outcome(**base, status=Status.FAILED, detail=short(error))
    fmodel.close()
    captured = fmodel.captured
    facts = {"tier": "jax", "points": len(captured.names()), "traces": len(captured.graphs)}
    worst = 0.0
    for call, (a, e) in enumerate(zip(got, expected, strict=True)):
        gap = _gap(a, e)
        if gap is None:
            return Outcome(**base, status=Status.WRONG, **facts,
                           detail=f"call {call}: outputs differ from jax.jit")  # fmt: skip
        worst = max(worst, gap)
        wrong = _probes(case, captured, call)
        if wrong:
            return Outcome(**base, status=Status.WRONG, **facts, detail=f"call {call}: {wrong}")
    if facts["traces"] > 2:
        return Outcome(**base, status=Status.FAILED, **facts,
                       detail=f"{facts['traces']} traces for 2 shapes")  # fmt: skip
    if worst == 0.0:
        return Outcome(**base, status=Status.BITWISE, **facts)
    return Outcome(**base, status=Status.TOLERANCE, **facts,
                   detail=f"max |diff| {worst:.1e} vs jax.jit (XLA fusion; rtol {RTOL}, atol {ATOL})")  # fmt: skip


def _gap(actual: Any, expected: Any) -> float | None:
    """The largest absolute difference of two output trees, None when not within tolerance."""
    a, e = jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)
    if len(a) != len(e):
        return None
    worst = 0.0
    for x, y in zip(a, e, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or not np.allclose(x, y, rtol=RTOL, atol=ATOL):
            return None
        if x.size and np.issubdtype(x.dtype, np.floating):
            worst = max(worst, float(np.max(np.abs(x - y))))
    return worst


def _probes(case: JaxCase, captured: Any, call: int) -> str:
    """Why a probe's eager value is not its point's value on ``call``, or ""."""
    names = captured.names()
    values = {n: np.asarray(captured.get(n, call=call)) for n in names}
    for name, want in case.probes(case.calls[call]).items():
        want = np.asarray(want)
        if case.by_value:
            if not any(_close(v, want) for v in values.values()):
                return f"the output of {name} is no captured value"
        elif name not in values:
            return f"{name} is not a point"
        elif not _close(values[name], want):
            return f"{name} differs from the submodule called on its input"
    return ""


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL))
