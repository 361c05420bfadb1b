"""The check of one PyTorch model: the instrumented model against eager, point by point.

``instrument(model, select="*", path=None)`` is called at two input shapes; each call's
outputs and every module output (a forward hook on the model, named as docs/names.md
says) must equal eager bit for bit, with at most two traces; a generative model's
``fmodel.generate`` tokens must equal ``model.generate``'s with every forward step a call.
On the dynamic tier a trace is a region between graph breaks, so the bound is two per
region: the second shape compiles at most as many regions as the first did.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch._export.utils import _compiling_state_context

import clouseau
from bench.zoo.outcome import Outcome, Status, short
from clouseau.capture.torch import to_numpy
from clouseau.ir import TraceKind
from clouseau.ir.errors import ClouseauError
from tests.models.helpers import OutputHooks, tensors_of

Call = tuple[tuple[Any, ...], dict[str, Any]]
# The bound on a model whose own code computes otherwise under torch.export (float32
# rounding of another algorithm), as docs/generation.md states for SDPA's export branch.
RTOL, ATOL = 1e-5, 1e-6
NOT_COMPARED = "n/a: "  # a generate outcome that is the model's, not clouseau's


@dataclass(frozen=True)
class TorchCase:
    """A model (eval mode) and its calls: two at different shapes, and a generate call."""

    family: str
    name: str
    model: torch.nn.Module
    calls: tuple[Call, ...]
    generate: Call | None = None
    task: str = field(default="")
    # What is captured: every point, or module-output globs (which take the hooks tier);
    # the module outputs it picks are compared.
    select: str | tuple[str, ...] = "*"


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
    try:
        outcome = check(case, expected)
    except Exception as error:  # clouseau raised where no call was made: unclear, FAILED
        outcome = Outcome("", "", "", Status.FAILED, detail=short(error))
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
    fmodel = clouseau.instrument(case.model, select=case.select, path=None)
    tier, points, structure, first, tolerance = "", 0, "", 0, ""
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
            wrong = _compare(got, want, hooks, captured, index, case.select)
            if wrong and graph.trace_kind is TraceKind.TORCH_EXPORT:
                branch = _export_branch(case, call, (got, want), captured, index, wrong)
                tolerance, wrong = (tolerance or branch, "") if branch else (tolerance, wrong)
            if wrong:
                return Outcome("", "", "", Status.WRONG, tier=tier, points=points,
                               traces=fmodel.traces, detail=f"call {index}: {wrong}")  # fmt: skip
            # Equal values in another container (dict for OrderedDict): not a drop-in.
            structure = structure or _same_structure(got, want)
            first = first or fmodel.traces
        traces = fmodel.traces
    finally:
        fmodel.close()
    generated = _generate(case) if case.generate is not None else ""
    if structure:
        return Outcome("", "", "", Status.FAILED, tier=tier, points=points, traces=traces,
                       detail=f"{structure} (every value equal)")  # fmt: skip
    regions = tier == TraceKind.TORCH_DYNAMO.value
    if traces > (2 * first if regions else 2):
        why = f"{traces} traces for 2 shapes" + (
            f" ({first} regions at the first)" if regions else ""
        )
        return Outcome("", "", "", Status.FAILED, tier=tier, points=points, traces=traces,
                       generate=generated, detail=why)  # fmt: skip
    if generated not in ("", "equal") and not generated.startswith(NOT_COMPARED):
        return Outcome("", "", "", Status.FAILED, tier=tier, points=points, traces=traces,
                       generate=generated, detail=f"generate: {generated}")  # fmt: skip
    # The dynamic tier's traces are regions: how many one call compiles says why so many
    # (torchvision's detection models break the graph at each data-dependent size).
    detail = f"{first} regions at the first call" if regions else ""
    if tolerance:
        return Outcome("", "", "", Status.TOLERANCE, tier=tier, points=points, traces=traces,
                       generate=generated, detail=tolerance)  # fmt: skip
    return Outcome("", "", "", Status.BITWISE, tier=tier, points=points, traces=traces,
                   generate=generated, detail=detail)  # fmt: skip


def _export_branch(
    case: TorchCase, call: Call, outputs: tuple[Any, Any], captured: Any, index: int, wrong: str
) -> str:
    """The tolerance detail when the export tier's values differ from eager only because the
    model computes otherwise under torch.export (``if not is_torchdynamo_exporting():``, a
    triangular solve by forward substitution): every value equals, bit for bit, an eager
    run that takes export's branch, and the outputs are within RTOL/ATOL of eager. Else "".
    torch.export must set the flag (its own code reads it), so no tracer avoids the branch.
    """
    got, want = outputs
    with _compiling_state_context():  # what the model's code sees while torch.export traces
        branch, hooks = _eager(case.model, call)
    if _compare(got, branch, hooks, captured, index, case.select):
        return ""
    for a, e in zip(tensors_of(got), tensors_of(want), strict=True):
        x, y = to_numpy(a), to_numpy(e)
        if np.issubdtype(x.dtype, np.floating) and not np.allclose(x, y, RTOL, ATOL, True):
            return ""
    return (f"call {index}: {wrong}: the model's own torch.export branch (it reads "
            f"torch.compiler.is_exporting()); bitwise equal to eager taking that branch, "
            f"rtol {RTOL}, atol {ATOL} of eager")  # fmt: skip


def _compare(
    got: Any, want: Any, hooks: OutputHooks, captured: Any, call: int, select: str | tuple[str, ...]
) -> str:
    """Why the call's outputs or the module points ``select`` picks differ from eager, or ""."""
    a, e = tensors_of(got), tensors_of(want)
    if len(a) != len(e):
        return f"{len(a)} output tensors, eager has {len(e)}"
    for i, (x, y) in enumerate(zip(a, e, strict=True)):
        if why := _differs(to_numpy(x), to_numpy(y)):
            return f"output {i} {why}"
    values = hooks.named(captured.graph)
    if select != "*":  # a module's elements (<path>:0) are picked with it
        globs = (select,) if isinstance(select, str) else select
        values = {name: value for name, value in values.items()
                  if any(fnmatch.fnmatchcase(name.split(":")[0], g) for g in globs)}  # fmt: skip
        if not values:
            return f"select={select!r} picks no module output"
    missing = sorted(set(values) - set(captured.names()))
    if missing:
        return f"{len(missing)} module outputs are not points: {missing[:5]}"
    for name, value in values.items():
        if why := _differs(np.asarray(captured.get(name, call=call)), to_numpy(value)):
            return f"{name} {why}"
    return ""


def _differs(actual: np.ndarray, expected: np.ndarray) -> str:
    """How two arrays differ (shape, dtype, values; NaN equals NaN), or ""."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return (
            f"is {actual.dtype}{list(actual.shape)}, eager {expected.dtype}{list(expected.shape)}"
        )
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected)
                                  if np.issubdtype(actual.dtype, np.floating) else False)  # fmt: skip
    if np.all(same):
        return ""
    gap = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    return f"differs from eager at {int((~same).sum())} of {same.size} (max |diff| {np.nanmax(gap):.2e})"


def _same_structure(got: Any, want: Any) -> str:
    """Why the output's container differs from eager's (values aside), or ""."""
    if type(got) is not type(want):
        return f"output is a {type(got).__name__}, eager's a {type(want).__name__}"
    return ""


class _Steps:
    """Counts generate's forward steps: the model's calls, and an encoder-decoder's encoder
    calls made outside the model's forward (``generate`` encodes once, before decoding)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count, self._depth = 0, 0
        modules = [model]
        if getattr(model.config, "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
            modules.append(model.get_encoder())
        self._handles = [h for m in modules for h in (
            m.register_forward_pre_hook(self._enter), m.register_forward_hook(self._leave))]  # fmt: skip

    def _enter(self, *_: Any) -> None:
        self.count += self._depth == 0
        self._depth += 1

    def _leave(self, *_: Any) -> None:
        self._depth -= 1

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _generate(case: TorchCase) -> str:
    """``"equal"`` when fmodel.generate gives model.generate's tokens with every step a call."""
    assert case.generate is not None
    args, kwargs = case.generate
    steps = _Steps(case.model)
    try:
        torch.manual_seed(2)
        with torch.no_grad():
            want = case.model.generate(*args, **kwargs)
    except Exception as error:  # the model's own generate fails: nothing to compare
        return f"{NOT_COMPARED}model.generate fails ({short(error, 100)})"
    finally:
        steps.remove()
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
    if calls != steps.count:
        return f"{calls} calls captured for {steps.count} forward steps"
    return "equal"
