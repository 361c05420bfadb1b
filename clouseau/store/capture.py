"""The in-Python view of a capture: a Mapping of point name -> numpy array."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from clouseau.ir.errors import CaptureError, ClouseauError
from clouseau.ir.graph import Graph
from clouseau.ir.selection import closest


@dataclass(frozen=True)
class Record:
    """What the store knows of one saved array (kept in each file's ``__metadata__``).

    ``order`` is the position of the array within its call; ``index`` the loop iteration
    (scan) it belongs to, ``()`` outside loops; ``graph`` the id of the traced signature.
    """

    key: str
    names: tuple[str, ...]
    node: str
    call: int
    order: int
    graph: int = 0
    index: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.names[0]

    def to_json(self) -> list[Any]:
        return [
            self.key,
            list(self.names),
            self.node,
            self.call,
            self.order,
            self.graph,
            list(self.index),
        ]

    @staticmethod
    def from_json(item: object) -> Record:
        """The record ``to_json`` wrote; ValueError if ``item`` is not one."""
        if not (isinstance(item, list) and len(item) == 7):
            raise ValueError(f"a record is a list of 7 fields, not {_short(item)}")
        key, names, node, call, order, graph, index = item
        if not (
            isinstance(key, str)
            and isinstance(node, str)
            and isinstance(names, list)
            and names
            and all(isinstance(n, str) for n in names)
            and all(_is_count(v) for v in (call, order, graph))
            and isinstance(index, list)
            and all(_is_count(i) for i in index)
        ):
            raise ValueError(f"malformed record {_short(item)}")
        return Record(key, tuple(names), node, call, order, graph, tuple(index))


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def tensor_key(name: str, call: int, index: tuple[int, ...]) -> str:
    """The key of an array inside a safetensors file: ``<name>#<call>`` (``@i`` per loop index)."""
    return f"{name}#{call}" + "".join(f"@{i}" for i in index)


def encode_record(record: Record) -> str:
    """One record as it appears in the ``clouseau`` metadata list (``to_json`` as JSON)."""
    # Spelled out rather than json.dumps(record.to_json()): twice as fast, and put() runs
    # this once per saved array. Strings go through json's own escaping.
    names = ",".join(map(encode_basestring_ascii, record.names))
    index = ",".join(map(str, record.index))
    return (
        f"[{encode_basestring_ascii(record.key)},[{names}],{encode_basestring_ascii(record.node)},"
        f"{record.call},{record.order},{record.graph},[{index}]]"
    )


class AmbiguousPointError(ClouseauError, KeyError):
    """A name's calls cannot be stacked (their shapes differ); ``cap.get(name, call=k)`` picks one."""

    def __str__(self) -> str:
        # KeyError would show the repr of the message, quotes and escapes included.
        return str(self.args[0])


@dataclass(frozen=True)
class Entry:
    """One saved array: its record and how to read it (lazily, from a file or memory)."""

    record: Record
    load: Callable[[], np.ndarray]


class Capture(Mapping[str, np.ndarray]):
    """The activations of one capture: a Mapping of point name -> numpy array.

    Iteration yields every point name in execution order (as ``names()``), and
    ``cap[name]`` is its value, so ``dict(cap)``, ``cap.values()`` and ``cap.items()``
    work for any capture:

    - a name captured in one call: its array (stacked over loop iterations, first axis,
      when captured inside ``scan``);
    - a name captured in several calls: those calls' arrays stacked along a new first
      axis, in call order (``cap[name][i]`` is ``cap.all_calls(name)[i]``; the calls are
      ``cap.calls_of(name)``). When the calls' shapes differ (a last, smaller batch) they
      cannot be stacked: ``AmbiguousPointError`` (a ``KeyError``) names the fix,
      ``cap.get(name, call=k)`` or ``cap.all_calls(name)``.

    Attributes
    ----------
    graphs : tuple of Graph
        The IR of every traced input signature, by graph id; ``graph`` is the first.
    failed_calls : Mapping of int to str
        The calls that raised, with the error; what they saved before is kept.
    partial_calls : Mapping of int to str
        The calls whose values are not all on disk, with why: the process stopped while
        they were written (``kill -9``, a crash), or writing failed (a full disk). What
        is on disk of them loads; it is not the whole call.
    damaged : Mapping of str to str
        The files of the directory that could not be read, by name, with why (truncated,
        corrupt, a link, missing though written, a duplicate). ``load`` skips them, warns,
        and loads the rest; ``load(path, strict=True)`` raises instead.
    calls_made : int or None
        How many calls the model made (from ``status.json``; None if it does not say).
        Kept current within a few seconds while the capture is written.
    closed : bool
        Whether the capture was closed (``fmodel.close()``, the end of a ``with`` block,
        or the end of the program); False while it is written, or after a crash.
    path : Path or None
        The capture directory, None for an in-memory capture.
    """

    def __init__(
        self,
        entries: tuple[Entry, ...],
        graphs: tuple[Graph, ...] = (),
        failed_calls: Mapping[int, str] | None = None,
        path: Path | None = None,
        *,
        partial_calls: Mapping[int, str] | None = None,
        damaged: Mapping[str, str] | None = None,
        calls_made: int | None = None,
        closed: bool = True,
    ) -> None:
        self._entries = tuple(
            sorted(entries, key=lambda e: (e.record.call, e.record.order, e.record.index))
        )
        self.graphs = tuple(graphs)
        self.failed_calls: Mapping[int, str] = MappingProxyType(dict(failed_calls or {}))
        self.partial_calls: Mapping[int, str] = MappingProxyType(dict(partial_calls or {}))
        self.damaged: Mapping[str, str] = MappingProxyType(dict(damaged or {}))
        self.calls_made = calls_made
        self.closed = closed
        self.path = path
        self._calls = tuple(sorted({e.record.call for e in self._entries}))
        self._by_name: dict[str, list[Entry]] = {}
        # (name, call) -> entries: show and diff read every point of every call, and a
        # scan of all calls per lookup would make them quadratic in calls.
        self._by_name_call: dict[tuple[str, int], list[Entry]] = {}
        for entry in self._entries:
            for name in entry.record.names:
                self._by_name.setdefault(name, []).append(entry)
                self._by_name_call.setdefault((name, entry.record.call), []).append(entry)

    @property
    def complete(self) -> bool:
        """Closed, no damaged file, and every call whole on disk (none partial or lost)."""
        return self.closed and not self.damaged and not self.partial_calls

    @property
    def graph(self) -> Graph | None:
        """The IR of the first traced signature (``graphs`` holds all of them)."""
        return self.graphs[0] if self.graphs else None

    @property
    def records(self) -> tuple[Record, ...]:
        """Every saved array's record, in execution order (call, then order in the call)."""
        return tuple(e.record for e in self._entries)

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every saved array's record and lazy loader, in execution order."""
        return self._entries

    @property
    def calls(self) -> tuple[int, ...]:
        """The call indices that saved something, in order."""
        return self._calls

    def names(self) -> tuple[str, ...]:
        """Every captured point name, in execution order (first call first)."""
        return tuple(self._by_name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> np.ndarray:
        """The array of ``name``; its calls stacked along a new first axis if several."""
        return self._value(name, self._entries_for(name))

    def get(  # type: ignore[override]
        self,
        name: str,
        default: Any = None,
        *,
        call: int | None = None,
        index: int | tuple[int, ...] | None = None,
    ) -> Any:
        """The array of ``name``, or ``default`` when there is none.

        Parameters
        ----------
        name
            A point name, as ``names()`` lists them.
        default
            Returned when ``name`` (in ``call``, at ``index``) was not captured.
        call
            The call index (``calls`` lists them); without it, a name captured in several
            calls has them stacked along a new first axis, as ``cap[name]``.
        index
            The loop iteration (an int, or a tuple for nested loops) of a value saved inside
            ``scan``; without it such values come stacked.

        Returns
        -------
        numpy.ndarray or default
        """
        if call is None:
            entries = self._by_name.get(name, [])
        else:  # one lookup: show and diff call this for every point of every call
            entries = self._by_name_call.get((name, call), [])
        if index is not None:
            wanted = (index,) if isinstance(index, int) else tuple(index)
            entries = [e for e in entries if e.record.index == wanted]
            if len(entries) == 1:
                return entries[0].load()
        return self._value(name, entries) if entries else default

    def all_calls(self, name: str) -> list[np.ndarray]:
        """The arrays of ``name``, one per call that captured it, in call order."""
        entries = self._entries_for(name)
        calls = sorted({e.record.call for e in entries})
        return [_stack(self._by_name_call[name, c]) for c in calls]

    def calls_of(self, name: str) -> tuple[int, ...]:
        """The calls that captured ``name``, in order: the first axis of a stacked ``cap[name]``."""
        return tuple(sorted({e.record.call for e in self._entries_for(name)}))

    def _value(self, name: str, entries: list[Entry]) -> np.ndarray:
        by_call: dict[int, list[Entry]] = {}  # one pass: linear in calls
        for entry in entries:
            by_call.setdefault(entry.record.call, []).append(entry)
        calls = sorted(by_call)
        if len(calls) == 1:
            return _stack(entries)
        arrays = [_stack(by_call[c]) for c in calls]
        if len({(a.shape, a.dtype) for a in arrays}) > 1:
            shapes = ", ".join(sorted({str(a.shape) for a in arrays}))
            raise AmbiguousPointError(
                f"{name!r} was captured in {len(calls)} calls ({_span(set(calls))}) with "
                f"different shapes ({shapes}), which do not stack; pick one with "
                f"cap.get({name!r}, call=k), or take them all with cap.all_calls({name!r})"
            )
        return np.stack(arrays)

    def _entries_for(self, name: str) -> list[Entry]:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(
                f"{name!r} is not in this capture; closest: {closest(name, self._by_name)}"
            ) from None

    # -- datasets: rows across calls (clouseau.record) -----------------------------------
    def array(self, name: str) -> Any:
        """``name``'s arrays of every call as one lazy array of rows, read from disk on indexing.

        Needs the same shape after the first axis in every call (a recording with
        ``rows=True`` stores ``[tokens, d]``). Indexing reads only the rows asked for.

        Returns
        -------
        clouseau.store.rows.LazyArray
            ``shape``, ``dtype``, ``len``, ``a[i]``, ``a[i:j]``, ``a[index_array]``,
            ``np.asarray(a)``.
        """
        from clouseau.store.rows import LazyArray, columns

        return LazyArray(columns(self, (name,))[0])

    def iter_batches(
        self,
        names: str | Sequence[str],
        batch_size: int = 1024,
        *,
        shuffle: bool = True,
        seed: int | None = None,
        drop_last: bool = False,
        start: int = 0,
        format: str = "numpy",
    ) -> Iterator[Any]:
        """Stream rows of one or several names across every call, for training.

        Parameters
        ----------
        names
            A name (batches are arrays) or a list of names stored row for row, such as
            a point and its fields (batches are dicts name -> array).
        batch_size
            Rows per batch.
        shuffle
            A uniform random permutation of all rows (under ``seed``) instead of storage
            order; within a batch, rows come in storage order.
        seed
            Makes the shuffle deterministic; one epoch per seed (``seed=base + epoch``).
        drop_last
            Leave out the last, smaller batch.
        start
            The batch to start from: resumes an interrupted epoch at that position.
        format
            ``"numpy"``, ``"torch"`` or ``"jax"``.
        """
        from clouseau.store.rows import check_format, columns, convert, iter_rows, names_of

        wanted, single = names_of(names)
        check_format(format)
        if not (isinstance(batch_size, int) and batch_size > 0):
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        if not (isinstance(start, int) and start >= 0):
            raise ValueError(f"start must be a batch index >= 0; got {start!r}")
        cols = columns(self, wanted)
        batches = iter_rows(
            cols, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, start=start
        )
        for arrays in batches:
            out = [convert(a, format) for a in arrays]
            yield out[0] if single else dict(zip(wanted, out, strict=True))

    def to_torch_dataset(self, names: str | Sequence[str]) -> Any:
        """A map-style ``torch.utils.data.Dataset`` of rows (read on demand, fork-safe).

        ``ds[i]`` is a row (a tensor, or a dict for a list of names); ``ds[index_list]``
        a whole batch, for ``DataLoader(ds, sampler=BatchSampler(...), batch_size=None)``.
        """
        from clouseau.store.training import RowDataset

        return RowDataset.make(self, names)

    def to_parquet(
        self, directory: Any, names: Sequence[str] | None = None, rows_per_file: int = 1 << 16
    ) -> list[Any]:
        """Write rows of ``names`` (default: every name with rows) as Parquet files.

        Needs pyarrow (``pip install 'clouseau[arrow]'``). Returns the files written.
        """
        from clouseau.store.export import write_shards

        return write_shards(self, directory, names, rows_per_file, "parquet")

    def to_hf_dataset(
        self,
        names: Sequence[str] | None = None,
        directory: Any = None,
        rows_per_file: int = 1 << 16,
    ) -> Any:
        """A Hugging Face ``datasets.Dataset`` of rows, memory-mapped from Arrow files.

        The Arrow files go to ``directory`` (default: ``hf/`` in the capture directory).
        Needs ``datasets`` (``pip install 'clouseau[arrow]'``).
        """
        from clouseau.store.export import hf_dataset

        return hf_dataset(self, names, directory, rows_per_file)

    def stats(self, name: str) -> Any:
        """The running statistics ``clouseau.record(..., stats=...)`` kept for ``name``.

        Returns
        -------
        clouseau.store.stats.PointStats
            ``count``, ``mean``, ``var``, ``std``, ``min``, ``max`` (per feature, the last
            axis) and ``norm_mean``.
        """
        from clouseau.store.progress import read_progress
        from clouseau.store.stats import stats_from_json

        progress = read_progress(self.path) if self.path is not None else None
        state = progress.stats.get(name) if progress is not None else None
        result = stats_from_json(state) if state is not None else None
        if result is None:
            raise KeyError(
                f"no statistics of {name!r} in this capture; record with "
                f"clouseau.record(..., stats=True) (or stats=[{name!r}])"
            )
        return result

    @property
    def batches(self) -> tuple[Any, ...]:
        """The batches of a recording (``clouseau.record``), in order; ``()`` otherwise.

        Each is a ``Batch``: ``index`` (its call), samples ``start``..``stop``, and the
        ``error`` of a skipped batch.
        """
        from clouseau.store.progress import read_progress

        progress = read_progress(self.path) if self.path is not None else None
        return progress.batches if progress is not None else ()

    def to_pandas(self) -> Any:
        """One row per saved array: name, call, shape, dtype and the IR metadata of its node.

        Needs pandas (``pip install 'clouseau[pandas]'``).
        """
        from clouseau.ir.tables import capture_frame

        return capture_frame(self.records, self.graphs)

    def __repr__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        state = " (damaged or incomplete)" if self.damaged or self.partial_calls else ""
        return f"<Capture{where}: {len(self)} points, {len(self.calls)} call(s){state}>"


def _stack(entries: list[Entry]) -> np.ndarray:
    # Values saved inside loops are stacked in iteration order; nested loops (an index of
    # several ints) that cover a full grid become one axis per loop, as scan would stack.
    if len(entries) == 1 and not entries[0].record.index:
        return entries[0].load()
    ordered = sorted(entries, key=lambda e: e.record.index)
    try:
        stacked = np.stack([e.load() for e in ordered])
    except ValueError as err:
        raise CaptureError(
            f"{ordered[0].record.name!r} was saved {len(ordered)} times in one call with "
            f"different shapes ({err}); read them one by one with cap.get(..., index=i)"
        ) from None
    indices = [e.record.index for e in ordered]
    depth = len(indices[0])
    if depth > 1 and all(len(i) == depth for i in indices):
        grid = tuple(max(i[d] for i in indices) + 1 for d in range(depth))
        if len(set(indices)) == len(indices) == math.prod(grid):
            return stacked.reshape(grid + stacked.shape[1:])
    return stacked


def _span(calls: set[int]) -> str:
    ordered = sorted(calls)
    return ", ".join(map(str, ordered)) if len(ordered) <= 5 else f"{ordered[0]}..{ordered[-1]}"
