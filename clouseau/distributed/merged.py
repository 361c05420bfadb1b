"""The capture of several processes read as one: calls, ranks, batches and statistics.

Under torchrun each rank's ``clouseau.record`` keeps its own ``record.json``: its batches
numbered ``0, 1, 2...`` with samples counted from 0, and running statistics over its share.
:class:`PartedCapture` gives the merged view: batch ``k`` of rank ``r`` is batch
``k * world_size + r``, the samples are counted over the batches in that global order (the
``sample`` field of a rows layout too), and the statistics of the ranks are merged (Chan
et al.'s parallel update, as :mod:`clouseau.store.stats` merges batches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from clouseau.ir.graph import Graph
from clouseau.store.capture import Capture, Entry
from clouseau.store.progress import Batch, Progress
from clouseau.store.sources import TensorSource
from clouseau.store.stats import PointStats, RunningStats

Renumber = Callable[[int], int]


class PartedCapture(Capture):
    """A capture written by several processes, read as one.

    Calls keep their global numbers (by batch index); ``rank(call)`` says which process
    ran a call.

    Attributes
    ----------
    world_size : int
        How many processes wrote the capture.
    missing_ranks : tuple of int
        The processes whose part did not finish (absent, or never closed); what they
        wrote before is in the capture.
    ranks : Mapping of int to int
        The rank of every call that saved something.
    """

    def __init__(
        self,
        entries: tuple[Entry, ...],
        graphs: tuple[Graph, ...],
        failed_calls: Mapping[int, str],
        path: Path,
        *,
        world_size: int,
        missing_ranks: tuple[int, ...],
        ranks: Mapping[int, int],
        progress: Mapping[int, tuple[Progress, Renumber]] | None = None,
        **store: Any,
    ) -> None:
        self._progress = dict(progress or {})
        self._batches = merge_batches(self._progress)
        super().__init__(_global_samples(entries, self._batches), graphs, failed_calls, path, **store)  # fmt: skip
        self.world_size = world_size
        self.missing_ranks = missing_ranks
        self.ranks: Mapping[int, int] = MappingProxyType(dict(ranks))

    def rank(self, call: int) -> int:
        """The rank of the process that ran ``call``."""
        try:
            return self.ranks[call]
        except KeyError:
            raise KeyError(f"call {call} saved nothing; the calls are {self.calls}") from None

    @property
    def batches(self) -> tuple[Batch, ...]:
        """Every rank's batches of a recording, in global order (``index`` the call).

        ``start``..``stop`` count the samples over all ranks' batches in that order, as one
        process over the whole data would.
        """
        return tuple(batch for batch, _ in self._batches.values())

    def stats(self, name: str) -> PointStats:
        """The running statistics of ``name`` over every rank's batches (see
        :meth:`Capture.stats`)."""
        merged = RunningStats()
        for progress, _ in self._progress.values():
            if name in progress.stats:
                merge_into(merged, RunningStats.from_json(progress.stats[name]))
        result = merged.result()
        if result is None:
            raise KeyError(
                f"no statistics of {name!r} in this capture; record with "
                f"clouseau.record(..., stats=True) (or stats=[{name!r}])"
            )
        return result

    def __repr__(self) -> str:
        missing = f", ranks {list(self.missing_ranks)} missing" if self.missing_ranks else ""
        return f"{super().__repr__()[:-1]} from {self.world_size} processes{missing}>"


def merge_batches(
    progress: Mapping[int, tuple[Progress, Renumber]],
) -> dict[int, tuple[Batch, int]]:
    """Global call -> (the batch with global numbers, its first local sample)."""
    local = sorted((renumber(b.index), b) for p, renumber in progress.values() for b in p.batches)
    merged: dict[int, tuple[Batch, int]] = {}
    start = 0
    for call, batch in local:
        stop = start + batch.stop - batch.start
        merged[call] = (replace(batch, index=call, start=start, stop=stop), batch.start)
        start = stop
    return merged


def merge_into(total: RunningStats, part: RunningStats) -> None:
    """Add ``part``'s rows to ``total`` (the parallel update of mean and squared deviations)."""
    if part.mean is None or part.m2 is None or part.min is None or part.max is None:
        return
    if total.mean is None or total.m2 is None or total.min is None or total.max is None:
        total.count, total.mean, total.m2 = part.count, part.mean, part.m2
        total.min, total.max, total.norm_sum = part.min, part.max, part.norm_sum
        return
    count = total.count + part.count
    delta = part.mean - total.mean
    total.mean = total.mean + delta * (part.count / count)
    total.m2 = total.m2 + part.m2 + delta**2 * (total.count * part.count / count)
    total.min, total.max = np.minimum(total.min, part.min), np.maximum(total.max, part.max)
    total.count, total.norm_sum = count, total.norm_sum + part.norm_sum


def _global_samples(
    entries: tuple[Entry, ...], batches: Mapping[int, tuple[Batch, int]]
) -> tuple[Entry, ...]:
    # A rows layout stores each row's sample number as the rank counted it; the merged
    # capture counts over all ranks.
    if not batches:
        return entries
    out = []
    for entry in entries:
        record = entry.record
        found = batches.get(record.call)
        if record.node == "field" and record.names[0] == "sample" and found is not None:
            shift = found[0].start - found[1]
            entry = Entry(record, _shifted(entry.load, shift))
        out.append(entry)
    return tuple(out)


def _shifted(load: Callable[[], np.ndarray], shift: int) -> Callable[[], np.ndarray]:
    if isinstance(load, TensorSource):  # still a file: the row readers map it
        return replace(load, shift=load.shift + shift)
    return lambda: load() + shift
