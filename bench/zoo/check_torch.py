"""The check of one PyTorch model: the instrumented model against eager, point by point.

``instrument(model, select="*", path=None)`` is called at two input shapes; each call's
outputs and every module output (a forward hook on the model, named as docs/names.md
says) must equal eager bit for bit, with at most two traces; a generative model's
``fmodel.generate`` tokens must equal ``model.generate``'s with every forward step a call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import clouseau
from bench.zoo.outcome import Outcome, Status, short
from clouseau.ir.errors import ClouseauError
from tests.models.helpers import OutputHooks, assert_equal, tensors_of

Call = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class TorchCase:
    """A model (eval mode) and its calls: two at different shapes, and a generate call."""

    family: str
    name: str
    model: torch.nn.Module
    calls: tuple[Call, ...]
    generate: Call | None = None
    task: str = field(default="")


class EagerFailure(Exception):
    """The model itself fails eagerly: not clouseau's to capture."""


def run_case(build: Callable[[], TorchCase], family: str, name: str) -> Outcome:
    """Build the case (a failure is NO_TINY) and check it."""
    started = time.perf_counter()
    try:
        torch.manual_seed(0)
        case = build()
        expected = [_eager(case.model, call) for call in case.calls]
    except Exception as error:  # the model, not clouseau: excluded from the counts
        return Outcome(family, name, "", Status.NO_TINY, detail=short(error),
                       seconds=time.perf_counter() - started)  # fmt: skip
    task = case.task or type(case.model).__name__
    outcome = check(case, expected)
    return Outcome(**{**outcome.__dict__, "family": family, "name": name, "task": task,
                      "seconds": round(time.perf_counter() - started, 1)})  # fmt: skip


def _eager(model: torch.nn.Module, call: Call) -> tuple[Any, dict[str, list[Any]]]:
    """The eager output and every module call's outputs (a forward hook), deterministic:
    a second run must give the same outputs, or the model is not comparable bitwise."""
    hooks = OutputHooks(model)
    try:
        out = _call(model, call)
    finally:
        hooks.remove()
    again = tensors_of(_call(model, call))
    for a, b in zip(tensors_of(out), again, strict=True):
        if not torch.equal(a, b) and not torch.allclose(a, b, rtol=0, atol=0, equal_nan=True):
            raise EagerFailure("eager outputs differ between two runs")
    if not hooks.calls:
        raise EagerFailure("the model has no submodule calls to compare")
    return out, hooks


def _call(model: torch.nn.Module, call: Call) -> Any:
    args, kwargs = call
    torch.manual_seed(1)
    with torch.no_grad():
        return model(*args, **kwargs)


def check(case: TorchCase, expected: list[Any]) -> Outcome:
    """The instrumented model's calls against ``expected`` (from :func:`_eager`)."""
    fmodel = clouseau.instrument(case.model, select="*", path=None)
    tier, points = "", 0
    try:
        for index, (call, (want, hooks)) in enumerate(zip(case.calls, expected, strict=True)):
            try:
                got = _call(fmodel, call)
            except ClouseauError as error:
                return Outcome("", "", "", Status.REFUSED, tier=tier, detail=short(error))
            except Exception as error:
                return Outcome("", "", "", Status.FAILED, tier=tier, detail=short(error))
            captured = fmodel.captured
            graph = captured.graph
            tier, points = graph.trace_kind.value, max(points, len(captured.names()))
            wrong = _compare(got, want, hooks, captured, index)
            if wrong:
                return Outcome("", "", "", Status.WRONG, tier=tier, points=points,
                               traces=fmodel.traces, detail=f"call {index}: {wrong}")  # fmt: skip
        traces = fmodel.traces
    finally:
        fmodel.close()
    generated = _generate(case) if case.generate is not None else ""
    if traces > 2:
        return Outcome("", "", "", Status.FAILED, tier=tier, points=points, traces=traces,
                       generate=generated, detail=f"{traces} traces for 2 shapes")  # fmt: skip
    if generated not in ("", "equal"):
        return Outcome("", "", "", Status.FAILED, tier=tier, points=points, traces=traces,
                       generate=generated, detail=f"generate: {generated}")  # fmt: skip
    return Outcome("", "", "", Status.BITWISE, tier=tier, points=points, traces=traces,
                   generate=generated)  # fmt: skip


def _compare(got: Any, want: Any, hooks: OutputHooks, captured: Any, call: int) -> str:
    """Why the call's outputs or module points differ from eager, or ""."""
    try:
        a, e = tensors_of(got), tensors_of(want)
        if type(got) is not type(want) or len(a) != len(e):
            return (
                f"output structure {type(got).__name__}/{len(a)} != {type(want).__name__}/{len(e)}"
            )
        for i, (x, y) in enumerate(zip(a, e, strict=True)):
            assert_equal(x, y, f"output {i}")
        values = hooks.by_name(captured.graph)
        names = set(captured.names())
        missing = sorted(set(values) - names)
        if missing:
            return f"{len(missing)} module outputs are not points: {missing[:5]}"
        for name, value in values.items():
            assert_equal(captured.get(name, call=call), value, name)
    except AssertionError as error:
        return short(str(error), 400)
    return ""


def _generate(case: TorchCase) -> str:
    """ "equal" when fmodel.generate gives model.generate's tokens with every step a call."""
    assert case.generate is not None
    args, kwargs = case.generate
    steps = []
    handle = case.model.register_forward_pre_hook(lambda *_: steps.append(1))
    try:
        torch.manual_seed(2)
        with torch.no_grad():
            want = case.model.generate(*args, **kwargs)
    except Exception as error:
        return f"model.generate fails: {short(error, 120)}"
    finally:
        handle.remove()
    fmodel = clouseau.instrument(case.model, select="*", path=None)
    try:
        torch.manual_seed(2)
        with torch.no_grad():
            got = fmodel.generate(*args, **kwargs)
        calls = len(fmodel.captured.calls)
    except Exception as error:
        return short(error, 200)
    finally:
        fmodel.close()
    if not torch.equal(tensors_of(got)[0], tensors_of(want)[0]):
        return "tokens differ from model.generate"
    if calls != len(steps):
        return f"{calls} calls captured for {len(steps)} forward steps"
    return "equal"
