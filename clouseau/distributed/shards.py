"""Arrays sharded across processes: written shard by shard, reassembled when read.

A process writes each shard it holds of a globally sharded array as a value of its own
(``index=(k,)``, the k-th shard it wrote of that value) and ``shards.json`` beside its
files says where each lies in the global array. Reading the parts together,
:func:`assemble` joins the shards of one value (from every part) into one entry whose
array is the global one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from clouseau.distributed.part_files import read_object
from clouseau.ir.errors import CaptureError
from clouseau.ir.sink import Bounds, SavedValue, Shards
from clouseau.store.capture import Capture, Entry
from clouseau.store.files import write_json

SHARDS_FILE = "shards.json"


class ShardLog:
    """The shards a part wrote: ``"name|call|k"`` -> global shape and bounds."""

    def __init__(self, part: Path) -> None:
        self.file = part / SHARDS_FILE
        self.placed: dict[str, Any] = {}

    def expand(self, call: int, values: Sequence[SavedValue], rank: int) -> list[SavedValue]:
        """``values`` as the sink stores them: each :class:`Shards` as one value a shard.

        A whole value is one every process holds the same of (SPMD): rank 0 writes it.
        """
        out = []
        for value in values:
            if not isinstance(value.array, Shards):
                if rank == 0:
                    out.append(value)
                continue
            for k, (bounds, data) in enumerate(value.array.held):
                index = (*value.index, k)
                out.append(SavedValue(value.names, value.node, data, index))
                key = f"{value.names[0]}|{call}|{','.join(map(str, index))}"
                self.placed[key] = {"shape": list(value.array.shape), "bounds": bounds}
        return out

    def write(self) -> None:
        if self.placed:
            write_json(self.file, self.placed, replace=True)


@dataclass(frozen=True)
class ShardEntry(Entry):
    """One shard of a global array: where it lies in it."""

    shape: tuple[int, ...] = ()
    bounds: Bounds = ()


def entries_of(capture: Capture) -> tuple[Entry, ...]:
    """The entries of one part's capture, a shard's marked with its place."""
    file = None if capture.path is None else Path(capture.path) / SHARDS_FILE
    if file is None or not os.path.lexists(file):
        return capture.entries
    placed = read_object(file)  # bounded, a regular file only
    out: list[Entry] = []
    for entry in capture.entries:
        r = entry.record
        key = f"{r.names[0]}|{r.call}|{','.join(map(str, r.index))}"
        where = placed.get(key)
        if where is None:
            out.append(entry)
            continue
        try:
            bounds = tuple((int(a), int(b)) for a, b in where["bounds"])
            shape = tuple(int(d) for d in where["shape"])
        except (KeyError, TypeError, ValueError) as err:
            raise CaptureError(
                f"{file} is damaged: the place of {key!r} is not a shape and bounds "
                f"({type(err).__name__}: {err}); record again"
            ) from None
        out.append(ShardEntry(r, entry.load, shape, bounds))
    return tuple(out)


def assemble(entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
    """The entries of a parted capture, with the shards of one array joined into one."""
    groups: dict[tuple[str, int, tuple[int, ...]], list[ShardEntry]] = {}
    out: list[Entry] = []
    for entry in entries:
        if isinstance(entry, ShardEntry):
            r = entry.record
            groups.setdefault((r.names[0], r.call, r.index[:-1]), []).append(entry)
        else:
            out.append(entry)
    for shards in groups.values():
        first = min(shards, key=lambda e: e.bounds)
        record = replace(first.record, index=first.record.index[:-1])
        out.append(Entry(record, _joiner(tuple(shards))))
    return tuple(out)


def _joiner(shards: tuple[ShardEntry, ...]):
    def join() -> np.ndarray:
        arrays = [s.load() for s in shards]
        whole = np.empty(shards[0].shape, dtype=arrays[0].dtype)
        covered = np.zeros(shards[0].shape, dtype=bool)
        for shard, array in zip(shards, arrays, strict=True):
            where = tuple(slice(a, b) for a, b in shard.bounds)
            whole[where] = array
            covered[where] = True
        if not covered.all():
            raise CaptureError(
                f"the shards of {shards[0].record.name!r} (call {shards[0].record.call}) "
                "do not cover the global array: a process's part is missing; load the "
                "capture once every process has finished"
            )
        return whole

    return join
