"""The tier sequence of a torch call: which tier a call takes and where a failure leads.

Every decision of the torch frontend about tiers is made here, as data
(:data:`SEQUENCE`) and small functions of plain facts, so that a test can drive it alone;
the rest of the frontend asks and obeys.

::

    call ─► module outputs only, no interventions, no gradients? ── yes ─► HOOKS (no trace)
             │ no
             ▼
            FX ── fails ─► EXPORT (first shape of a structure)
                           EXPORT_DYNAMIC (a later shape of a structure; a failure other
                           than the model's data-dependent control flow: EXPORT again)
                             │ both fail (untraceable), gradients asked: the error;
                             │ module outputs only (dotless names too): HOOKS
                             ▼
                           DYNAMO (regions between graph breaks; module outputs by hooks)
                             │ TorchDynamo itself fails
                             ▼
                           HOOK_FALLBACK (every module output by hooks, for good)

A traced tier serves every later call of its input structure; a call whose guards it
breaks traces again from FX. Once a model takes DYNAMO or HOOK_FALLBACK, every call does.
"""

from __future__ import annotations

import enum
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clouseau.capture.torch.tracing.sources import is_user_file


class Tier(enum.Enum):
    """A way of running a call of an instrumented torch model."""

    HOOKS = "hooks"  # the hook path: module outputs only, forward hooks, no trace
    FX = "torch.fx"
    EXPORT = "torch.export"
    EXPORT_DYNAMIC = "torch.export (dynamic shapes)"
    DYNAMO = "dynamic (TorchDynamo)"
    HOOK_FALLBACK = "hook"

    @property
    def traced(self) -> bool:
        """Whether the tier runs one lowered graph per input structure."""
        return self in (Tier.FX, Tier.EXPORT, Tier.EXPORT_DYNAMIC)


@dataclass(frozen=True)
class Step:
    """One tier of the sequence: which calls take it, and where its failure leads.

    ``on_failure`` None: the failure is the user's to see (an error, or the model's own
    exception, which every tier lets through).
    """

    tier: Tier
    takes: str
    on_failure: Tier | None
    failure: str


SEQUENCE: tuple[Step, ...] = (
    Step(
        Tier.HOOKS,
        "a selection of module outputs only (globs), no interventions, no gradients",
        None,
        "the model's own error",
    ),
    Step(Tier.FX, "every other call of a new input structure", Tier.EXPORT, "torch.fx fails"),
    Step(
        Tier.EXPORT,
        "the first shape of an input structure torch.fx cannot trace",
        Tier.DYNAMO,
        "torch.export fails too (untraceable)",
    ),
    Step(
        Tier.EXPORT_DYNAMIC,
        "a later shape of an input structure torch.fx cannot trace",
        Tier.DYNAMO,
        "the model's data-dependent control flow (other failures: a static export)",
    ),
    Step(
        Tier.DYNAMO,
        "every call of a model neither tracer can trace (no gradients)",
        Tier.HOOK_FALLBACK,
        "TorchDynamo itself fails",
    ),
    Step(Tier.HOOK_FALLBACK, "every call once TorchDynamo failed", None, "the model's own error"),
)

_STEPS = {step.tier: step for step in SEQUENCE}


def first_tier(module_outputs_only: bool, plain: bool) -> Tier:
    """The tier of a model's calls before any trace: ``module_outputs_only``, the selection
    can pick module outputs only; ``plain``, no interventions and no gradients."""
    return Tier.HOOKS if module_outputs_only and plain else Tier.FX


def export_tier(structure_seen: bool) -> Tier:
    """The export of a structure's first shape is static (solving symbolic shapes can take
    minutes, and a model called with one shape never needs it); a later shape's is
    dynamic, and serves every shape its guards allow."""
    return Tier.EXPORT_DYNAMIC if structure_seen else Tier.EXPORT


def on_failure(tier: Tier) -> Tier | None:
    """The tier a failure of ``tier`` leads to (None: the error goes to the user)."""
    return _STEPS[tier].on_failure


def after_untraceable(grads: bool, module_outputs_only: bool = False) -> Tier | None:
    """Where a model neither tracer can trace goes: gradients need a traced graph, so
    with ``grads`` the trace error is the user's; a selection that can pick module
    outputs only (dotless module names included, no interventions) takes the hook path,
    which saves all it picks without TorchDynamo (whose regions of a large model cost
    minutes of symbolic shapes at each new shape: Faster R-CNN's ``select=["rpn"]``)."""
    if grads:
        return None
    return Tier.HOOKS if module_outputs_only else on_failure(Tier.EXPORT)


def after_dynamic_call(dynamo_failed: bool) -> Tier:
    """The tier of the calls after one in the dynamic tier."""
    fallback = on_failure(Tier.DYNAMO)
    return fallback if dynamo_failed and fallback is not None else Tier.DYNAMO


def warn_tier(model: Any, tier: str, reasons: tuple[str, ...]) -> None:
    """Say which tier ``model`` uses and why the earlier ones failed."""
    why = "; ".join(reasons)
    warnings.warn(
        f"clouseau: {type(model).__name__} uses the {tier} tier ({why}). Calls record the "
        "branch each call takes; see docs/dynamic.md.",
        UserWarning,
        stacklevel=_user_level(),
    )


def _user_level() -> int:
    """The ``stacklevel`` of the innermost user frame: the warning points at the call."""
    frame: Any = sys._getframe(2)  # the warning function's caller: stacklevel 2
    level = 2
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level if frame is not None else 2


def picks(select: Any) -> bool:
    """Whether ``select`` is meant to pick something (not None, not an empty list)."""
    empty = isinstance(select, Sequence) and not isinstance(select, str) and not select
    return select is not None and not empty


def warn_empty(model: Any, select: Any, tier: Tier) -> None:
    """Say that a call of ``model`` saved nothing although ``select`` picks points (once
    per instrumented model: the caller keeps the flag)."""
    warnings.warn(
        f"clouseau: a call of {type(model).__name__} saved nothing for select={select!r} "
        f"in the {tier.value} tier: no point it names ran in this call (a branch or an "
        "early exit not taken, a module not called). Later calls that save nothing say "
        "nothing more; see docs/dynamic.md.",
        UserWarning,
        stacklevel=_user_level(),
    )


def warn_recompile_limit(model: Any, tier: str, limit: int) -> None:
    """Say that TorchDynamo reached its recompile limit in a call of ``model`` and ran a
    frame without compiling it (once per instrumented model: the caller keeps the flag)."""
    warnings.warn(
        f"clouseau: TorchDynamo reached its recompile limit "
        f"(torch._dynamo.config.recompile_limit = {limit}) in a call of "
        f"{type(model).__name__} in the {tier} tier, and runs that code without compiling "
        "it from now on: its module outputs are saved (forward hooks), the ops in it are "
        "not. Raise torch._dynamo.config.recompile_limit, or empty Dynamo's caches with "
        "torch.compiler.reset() (a process that compiled many models); see docs/dynamic.md.",
        UserWarning,
        stacklevel=_user_level(),
    )
