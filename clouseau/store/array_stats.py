"""Summary statistics of one array: mean, std, min, max over its finite elements.

One function for every place that shows an array's numbers: ``clouseau.diff`` (the
statistics of each side), ``clouseau show --stats``, the inspector's ``magnify`` and the
explorer's per-call statistics (which add a histogram over the same chunks).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArrayStats:
    """Summary statistics of an array, over its finite elements."""

    mean: float
    std: float
    min: float
    max: float
    nan: int
    inf: int
    size: int

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0


def array_stats(array: np.ndarray) -> ArrayStats:
    """Mean, std, min and max over the finite elements, and the NaN and Inf counts.

    Computed over chunks of the flattened array, so that memory beyond the array itself
    stays bounded (a float64 copy and masks of a 256 MiB array would take gigabytes).
    """
    acc = _Moments()
    for chunk in float_chunks(array):
        acc.add(chunk)
    return acc.stats(int(np.size(array)))


_CHUNK = 2**18  # elements per chunk of array_stats: 2 MiB as float64


def float_chunks(array: np.ndarray) -> Iterator[np.ndarray]:
    """The elements of ``array`` in order, as float64 chunks of ``2**18`` (complex: their
    modulus): what every statistic here is computed over, a few MiB at a time."""
    flat = np.asarray(array).reshape(-1)  # a view of a contiguous array, not a copy
    for start in range(0, flat.size, _CHUNK):
        x = as_float(flat[start : start + _CHUNK])
        yield np.abs(x) if np.iscomplexobj(x) else x


class _Moments:
    """Running count, mean, M2 (Chan et al.), min, max, NaN and Inf counts."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0
        self.min, self.max = math.inf, -math.inf
        self.nan = self.inf = 0

    def add(self, x: np.ndarray) -> None:
        nan_mask, inf_mask = np.isnan(x), np.isinf(x)
        self.nan += int(nan_mask.sum())
        self.inf += int(inf_mask.sum())
        finite = x[~(nan_mask | inf_mask)]
        if not finite.size:
            return
        n, mean = finite.size, float(finite.mean())
        m2 = float(((finite - mean) ** 2).sum())
        total = self.n + n
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.n * n / total
        self.mean += delta * n / total
        self.n = total
        self.min, self.max = min(self.min, float(finite.min())), max(self.max, float(finite.max()))

    def stats(self, size: int) -> ArrayStats:
        if not self.n:
            nan = float("nan")
            return ArrayStats(nan, nan, nan, nan, self.nan, self.inf, size)
        std = math.sqrt(max(self.m2 / self.n, 0.0))
        return ArrayStats(self.mean, std, self.min, self.max, self.nan, self.inf, size)


def as_float(x: np.ndarray) -> np.ndarray:
    """``x`` as float64 (complex128 when complex), for exact sums and comparisons."""
    if np.iscomplexobj(x):
        return x.astype(np.complex128)
    return x.astype(np.float64)
