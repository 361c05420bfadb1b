"""What the sweep records per model: an :class:`Outcome` of a :class:`Status`."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any


class Status(enum.Enum):
    """How a model fared; the values are what results.jsonl and docs/models.md say."""

    BITWISE = "bitwise"  # outputs and every module point equal eager, bit for bit
    TOLERANCE = "tolerance"  # equal within the stated tolerance (JAX: XLA's fusion choices)
    REFUSED = "refused"  # a clear error (ClouseauError) naming the cause and the fix
    WRONG = "wrong"  # a silently wrong or missing value: never acceptable
    FAILED = "failed"  # an unclear error, more traces than two, or generate differs
    TIMEOUT = "timeout"  # past the per-model time limit
    NO_TINY = "no tiny model"  # the model itself does not build or run from a tiny config

    @property
    def counts_as_supported(self) -> bool:
        return self in (Status.BITWISE, Status.TOLERANCE)


@dataclass(frozen=True)
class Outcome:
    """One model's result (one line of results.jsonl)."""

    family: str  # transformers, torchvision, timm, jax
    name: str  # the case's key: model type / builder / timm name / JAX case
    task: str  # the class instantiated (GPT2LMHeadModel, ...) or the JAX kind
    status: Status
    tier: str = ""  # the graph's trace kind (torch.fx, torch.export, ...) or ""
    points: int = 0
    traces: int = 0
    generate: str = ""  # "" (not generative), "equal" or why not
    detail: str = ""  # the tolerance and why, or the error (first line, shortened)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(**{**data, "status": Status(data["status"])})


def short(error: BaseException | str, limit: int = 300) -> str:
    """An error's type and first lines, on one line, at most ``limit`` characters."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
