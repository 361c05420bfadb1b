"""The layouts of ``clouseau.record`` in Ray blocks: ``rows=``, ``mask=``, ``fields=`` and
``stats=``.

An actor shapes each batch as ``record`` does (:class:`clouseau.dataset.layout.BatchRows`):
points stored as rows, padding dropped, the fields ``sample`` and ``position`` and the
user's fields beside them. A block does not know where its rows are in the data (the driver
numbers them afterwards), so its ``sample`` field counts from 0 in the block
(``clouseau.samples: local`` in its metadata) and the reader maps it to the block's rows.
The running statistics of a block's points go in its metadata (``clouseau.stats``) and the
reader merges them over the blocks it keeps, so a block run twice counts once.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clouseau.dataset.layout import BatchRows, FieldSource, Layout, take
from clouseau.store.stats import PointStats, RunningStats

SAMPLES_KEY, STATS_KEY = "clouseau.samples", "clouseau.stats"


@dataclass(frozen=True)
class BlockLayout:
    """What an actor stores of each batch beside the selected points."""

    layout: Layout
    stats: tuple[str, ...]

    @staticmethod
    def make(
        rows: bool | str | Sequence[str],
        mask: FieldSource | None,
        fields: Sequence[str] | Mapping[str, FieldSource] | None,
        stats: bool | str | Sequence[str],
    ) -> BlockLayout:
        from clouseau.dataset.recorder import _globs

        return BlockLayout(Layout.make(rows, mask, fields), _globs(stats, "stats"))

    def describe(self) -> dict[str, Any]:
        """What a resumed run must keep the same."""
        return {**self.layout.describe(), "stats": list(self.stats)}

    def shaper(self, columns: Mapping[str, np.ndarray]) -> BatchRows:
        mask = take(columns, self.layout.mask, "mask") if self.layout.mask else None
        return BatchRows(self.layout, mask)

    def metadata(self, items: Sequence[tuple[Any, np.ndarray]]) -> dict[str, str]:
        """A block file's metadata for its layout: local samples, its points' statistics."""
        meta = {SAMPLES_KEY: "local"} if self.layout.rows else {}
        if self.stats:
            states: dict[str, RunningStats] = {}
            for record, array in items:
                if record.node != "field" and any(
                    fnmatch.fnmatchcase(record.name, g) for g in self.stats
                ):
                    states.setdefault(record.name, RunningStats()).update(array)
            meta[STATS_KEY] = json.dumps({n: s.to_json() for n, s in states.items()})
        return meta


def global_samples(
    rows: Sequence[tuple[int, int]], read: Callable[[], np.ndarray]
) -> Callable[[], np.ndarray]:
    """A loader of a block's ``sample`` field numbered in the data (the block's rows)."""

    def load() -> np.ndarray:
        numbers = np.concatenate([np.arange(a, b) for a, b in rows]) if rows else np.empty(0)
        return numbers.astype(np.int64)[np.asarray(read(), dtype=np.int64)]

    return load


def merged_stats(states: Sequence[Mapping[str, Any]], name: str) -> PointStats | None:
    """The statistics of ``name`` over the blocks' states, in order."""
    from clouseau.distributed.merged import merge_into

    total = RunningStats()
    for state in states:
        if name in state:
            merge_into(total, RunningStats.from_json(state[name]))
    return total.result()
