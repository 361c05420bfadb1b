"""Per-call statistics of saved arrays and per-point errors of a diff, as the page shows them.

Everything here is numpy and plain data: the API layer reads captures and diffs and hands
over arrays and :class:`PointError` rows, so this exporter imports nothing from the store.
Non-finite floats cannot travel in JSON; :func:`json_safe` spells them ``"nan"``,
``"inf"`` and ``"-inf"``, and the page formats those strings as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HIST_BINS = 24


@dataclass(frozen=True)
class CallStats:
    """Statistics of one saved array (one call); mean/std/min/max over finite elements."""

    call: int
    shape: tuple[int, ...]
    dtype: str
    size: int
    mean: float
    std: float
    min: float
    max: float
    abs_mean: float
    zeros: int
    nan: int
    inf: int
    hist_lo: float
    hist_hi: float
    hist: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "c": self.call, "shape": list(self.shape), "dtype": self.dtype, "size": self.size,
            "mean": self.mean, "std": self.std, "min": self.min, "max": self.max,
            "absmean": self.abs_mean, "zeros": self.zeros, "nan": self.nan, "inf": self.inf,
            "hist": [self.hist_lo, self.hist_hi, list(self.hist)],
        }  # fmt: skip


@dataclass(frozen=True)
class PointError:
    """One row of a diff for the page: a point (by its name in ``a``) in one call."""

    name: str
    call: int
    status: str
    diverges: bool
    max_abs: float
    max_rel: float
    exceeding: int
    size: int

    def to_json(self) -> dict[str, object]:
        return {
            "c": self.call, "status": self.status, "diverges": self.diverges,
            "abs": self.max_abs, "rel": self.max_rel, "exceeding": self.exceeding,
            "size": self.size,
        }  # fmt: skip


def call_stats(call: int, array: np.ndarray) -> CallStats:
    """The :class:`CallStats` of ``array`` saved in ``call`` (complex: of its modulus)."""
    raw = np.asarray(array)
    x = raw.astype(np.complex128) if np.iscomplexobj(raw) else raw.astype(np.float64)
    if np.iscomplexobj(x):
        x = np.abs(x)
    nan_mask, inf_mask = np.isnan(x), np.isinf(x)
    finite = x[~(nan_mask | inf_mask)]
    zeros = int(np.count_nonzero(x == 0))
    if finite.size == 0:
        nan = math.nan
        return CallStats(call, tuple(raw.shape), str(raw.dtype), int(raw.size), nan, nan, nan,
                         nan, nan, zeros, int(nan_mask.sum()), int(inf_mask.sum()), nan, nan, ())  # fmt: skip
    lo, hi = float(finite.min()), float(finite.max())
    # np.histogram needs a non-empty range; a constant array gets one bin of width 1.
    counts, _ = np.histogram(finite, bins=HIST_BINS, range=(lo, hi) if hi > lo else (lo, lo + 1))
    return CallStats(
        call, tuple(raw.shape), str(raw.dtype), int(raw.size),
        float(finite.mean()), float(finite.std()), lo, hi, float(np.abs(finite).mean()),
        zeros, int(nan_mask.sum()), int(inf_mask.sum()), lo, hi if hi > lo else lo + 1,
        tuple(int(c) for c in counts),
    )  # fmt: skip


def json_safe(value: object) -> object:
    """``value`` with every non-finite float replaced by ``"nan"``, ``"inf"`` or ``"-inf"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
