"""Per-call statistics of saved arrays and per-point errors of a diff, as the page shows them.

Everything here is numpy and plain data: the API layer reads captures and diffs and hands
over statistics (or arrays) and :class:`PointError` rows; the statistics are those of
``clouseau.store.array_stats``, the one implementation of an array's numbers.
Non-finite floats cannot travel in JSON; :func:`json_safe` spells them ``"nan"``,
``"inf"`` and ``"-inf"``, and the page formats those strings as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from clouseau.store.array_stats import array_stats, float_chunks

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
    """The :class:`CallStats` of ``array`` saved in ``call`` (complex: of its modulus).

    Chunk by chunk (``store.array_stats``'s chunks, then one more pass for the histogram
    once its range is known), so that memory beyond the array stays a few MiB: the
    explorer streams a capture's arrays one at a time, and a float64 copy of each would
    be twice its size again.
    """
    raw = np.asarray(array)
    summary = array_stats(raw)
    zeros, abs_sum = 0, 0.0
    lo, hi = summary.min, summary.max
    if summary.nan + summary.inf == summary.size:  # nothing finite: no histogram
        for chunk in float_chunks(raw):
            zeros += int(np.count_nonzero(chunk == 0))
        nan = math.nan
        return CallStats(call, tuple(raw.shape), str(raw.dtype), int(raw.size), nan, nan, nan,
                         nan, nan, zeros, summary.nan, summary.inf, nan, nan, ())  # fmt: skip
    # np.histogram needs a non-empty range; a constant array gets one bin of width 1.
    top = hi if hi > lo else lo + 1
    counts = np.zeros(HIST_BINS, dtype=np.int64)
    for chunk in float_chunks(raw):
        zeros += int(np.count_nonzero(chunk == 0))
        finite = chunk[np.isfinite(chunk)]
        abs_sum += float(np.abs(finite).sum())
        counts += np.histogram(finite, bins=HIST_BINS, range=(lo, top))[0]
    finite_count = summary.size - summary.nan - summary.inf
    return CallStats(
        call, tuple(raw.shape), str(raw.dtype), int(raw.size),
        summary.mean, summary.std, lo, hi, abs_sum / finite_count,
        zeros, summary.nan, summary.inf, lo, top, tuple(int(c) for c in counts),
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
