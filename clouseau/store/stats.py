"""Running statistics of a recorded point, merged batch by batch (Chan et al.).

A point's values are taken as rows of its last axis (features): an array of shape
``[..., d]`` adds ``prod(...)`` rows of ``d`` features. Everything is accumulated in
float64 and merged in batch order, so a resumed recording (which restores the state saved
with the last complete file) ends with the same numbers as an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PointStats:
    """Statistics of one point over everything recorded, per feature (the last axis).

    Attributes
    ----------
    count : int
        Rows seen (every axis but the last, over all batches).
    mean, var, min, max : numpy.ndarray
        Per feature, shape ``[d]``; ``var`` is the population variance (``ddof=0``).
    norm_mean : float
        The mean L2 norm of a row, as SAE pipelines normalise by it.
    """

    count: int
    mean: np.ndarray
    var: np.ndarray
    min: np.ndarray
    max: np.ndarray
    norm_mean: float

    @property
    def std(self) -> np.ndarray:
        """The population standard deviation per feature."""
        return np.sqrt(self.var)


class RunningStats:
    """The merge state of one point: count, mean, sum of squared deviations, min, max."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None
        self.min: np.ndarray | None = None
        self.max: np.ndarray | None = None
        self.norm_sum = 0.0

    def update(self, array: np.ndarray) -> None:
        rows = _rows(array)
        n = rows.shape[0]
        if n == 0:
            return
        if self.mean is not None and self.mean.shape != rows.shape[1:]:
            raise ValueError(
                f"the statistics of a point need the same last axis in every batch; got "
                f"{rows.shape[1]} features after {self.mean.shape[0]}"
            )
        mean = rows.mean(axis=0)
        m2 = ((rows - mean) ** 2).sum(axis=0)
        norm_sum = float(np.sqrt((rows * rows).sum(axis=1)).sum())
        if self.mean is None or self.m2 is None or self.min is None or self.max is None:
            self.count, self.mean, self.m2 = n, mean, m2
            self.min, self.max = rows.min(axis=0), rows.max(axis=0)
        else:
            total = self.count + n
            delta = mean - self.mean
            self.mean = self.mean + delta * (n / total)
            self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
            self.min = np.minimum(self.min, rows.min(axis=0))
            self.max = np.maximum(self.max, rows.max(axis=0))
            self.count = total
        self.norm_sum += norm_sum

    def result(self) -> PointStats | None:
        if self.mean is None or self.m2 is None or self.min is None or self.max is None:
            return None
        return PointStats(
            self.count,
            self.mean,
            self.m2 / self.count,
            self.min,
            self.max,
            self.norm_sum / self.count,
        )

    def to_json(self) -> dict[str, Any]:
        def listed(a: np.ndarray | None) -> list[float] | None:
            return None if a is None else [float(v) for v in a]

        return {
            "count": self.count,
            "mean": listed(self.mean),
            "m2": listed(self.m2),
            "min": listed(self.min),
            "max": listed(self.max),
            "norm_sum": self.norm_sum,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> RunningStats:
        def array(v: list[float] | None) -> np.ndarray | None:
            return None if v is None else np.asarray(v, dtype=np.float64)

        stats = RunningStats()
        stats.count = int(data["count"])
        stats.mean, stats.m2 = array(data["mean"]), array(data["m2"])
        stats.min, stats.max = array(data["min"]), array(data["max"])
        stats.norm_sum = float(data["norm_sum"])
        return stats


def _rows(array: np.ndarray) -> np.ndarray:
    values = np.asarray(array, dtype=np.float64)
    if values.ndim == 0:
        return values.reshape(1, 1)
    if values.ndim == 1:
        return values.reshape(-1, 1)
    return values.reshape(-1, values.shape[-1])


def stats_from_json(data: dict[str, Any]) -> PointStats | None:
    """The statistics of one point as ``record.json`` keeps them."""
    return RunningStats.from_json(data).result()
