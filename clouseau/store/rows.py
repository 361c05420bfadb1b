"""Rows across calls: a point's arrays of every call read as one column, from disk.

A *column* is one name's arrays in call order, seen as rows along their first axis (a
token-level recording stores ``[tokens, d]`` per batch; any capture stores ``[batch, ...]``
per call). Nothing is loaded up front: rows are read from their files only when asked
for, with ``pread`` into the new array that is handed out (:mod:`clouseau.store.row_files`;
never a load from a memory map, which a file truncated under it turns into SIGBUS), so a
read costs the rows, not the file. A gather of scattered rows (a shuffled batch) is a few
kernel copies per file, whatever the number of calls.

The rows are those of the files ``load`` accepted, read through the loaders it made
(:class:`~clouseau.store.sources.TensorSource`): a file it skipped is never read, and a
file that changed since is refused (its stamp is checked before and after every read).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.store.row_files import RowFiles
from clouseau.store.sources import Stamp, TensorSource

if TYPE_CHECKING:
    from clouseau.store.capture import Capture, Entry

FORMATS = ("numpy", "torch", "jax")


@dataclass(frozen=True)
class Chunk:
    """One call's array of a column: where it lies (file and offset) or the array itself."""

    call: int
    rows: int
    file: Path | None
    offset: int
    array: np.ndarray | None = None
    stamp: Stamp | None = None
    shift: int = 0


class Column:
    """The rows of one name over every call, read from their files (see the module docstring)."""

    def __init__(
        self, name: str, dtype: np.dtype, row_shape: tuple[int, ...], chunks: Sequence[Chunk]
    ):
        self.name, self.dtype, self.row_shape = name, np.dtype(dtype), tuple(row_shape)
        self.chunks = tuple(chunks)
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        counts = np.array([c.rows for c in self.chunks], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        self.files = tuple(sorted({c.file for c in self.chunks if c.file is not None}))
        ids = {f: i for i, f in enumerate(self.files)}
        self.file_ids = np.array([ids.get(c.file, -1) for c in self.chunks], dtype=np.int64)
        self.offsets = np.array([c.offset for c in self.chunks], dtype=np.int64)
        self.shifts = np.array([c.shift for c in self.chunks], dtype=np.int64)
        self.reader = RowFiles({c.file: c.stamp for c in self.chunks if c.file is not None})

    def __len__(self) -> int:
        return int(self.starts[-1])

    def slice(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new array (contiguous ranges: one read per chunk)."""
        start, stop = max(0, start), min(len(self), stop)
        if stop <= start:
            return np.empty((0, *self.row_shape), self.dtype)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, stop, side="left"))
        out = np.empty((stop - start, *self.row_shape), self.dtype)
        raw = _bytes_of(out)
        at, used = 0, set()
        for i in range(first, last):
            lo = max(start, int(self.starts[i])) - int(self.starts[i])
            hi = min(stop, int(self.starts[i + 1])) - int(self.starts[i])
            chunk = self.chunks[i]
            if chunk.array is not None:
                out[at : at + hi - lo] = chunk.array[lo:hi]
            elif self.row_bytes:
                assert chunk.file is not None
                view = raw[at * self.row_bytes : (at + hi - lo) * self.row_bytes]
                self.reader.read(chunk.file, view, chunk.offset + lo * self.row_bytes)
                used.add(chunk.file)
                if chunk.shift:
                    out[at : at + hi - lo] += np.asarray(chunk.shift).astype(self.dtype)
            at += hi - lo
        for file in used:
            self.reader.check(file)
        return out

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows at the global indices ``rows`` (any order), as a new array."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row index out of range for {self.name!r} of {len(self)} rows")
        out = np.empty((rows.size, *self.row_shape), self.dtype)
        if not rows.size or not self.row_bytes:
            return out
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        self._gather(out, chunk, rows - self.starts[chunk])
        if self.shifts.any():
            shift = self.shifts[chunk].reshape(-1, *(1,) * len(self.row_shape))
            out += shift.astype(out.dtype)
        return out

    def _gather(self, out: np.ndarray, chunk: np.ndarray, local: np.ndarray) -> None:
        """Fill ``out`` with rows ``local`` of chunks ``chunk`` (any order)."""
        file_ids = self.file_ids[chunk]
        for i in np.unique(chunk[file_ids < 0]):  # a capture in memory
            ids = chunk == i
            array = self.chunks[int(i)].array
            assert array is not None
            out[ids] = array[local[ids]]
        on_disk = np.flatnonzero(file_ids >= 0)
        if not on_disk.size:
            return
        offsets = self.offsets[chunk[on_disk]] + local[on_disk] * self.row_bytes
        ids = file_ids[on_disk]
        rows = out.reshape(out.shape[0], -1).view(np.uint8)
        for i in np.unique(ids):
            file = self.files[int(i)]
            mine = ids == i
            # Sorted by offset within the file: neighbouring rows are read together.
            by_offset = np.argsort(offsets[mine], kind="stable")
            self.reader.gather(file, rows, on_disk[mine][by_offset], offsets[mine][by_offset])
            self.reader.check(file)


def _bytes_of(out: np.ndarray) -> memoryview:
    """The bytes of the new, contiguous array ``out``, to read into."""
    return memoryview(out.reshape(-1).view(np.uint8))


def columns(cap: Capture, names: Sequence[str]) -> tuple[Column, ...]:
    """The columns of ``names`` in ``cap``; they must have the same rows in every call."""
    cols = tuple(_column(cap, name) for name in names)
    for col in cols[1:]:
        if [c.rows for c in col.chunks] != [c.rows for c in cols[0].chunks]:
            raise CaptureError(
                f"{cols[0].name!r} and {col.name!r} do not have the same rows in every call "
                f"({len(cols[0])} and {len(col)} in all); read them together only when they "
                "were stored row for row (e.g. a point and its fields with rows=True)"
            )
    return cols


def _column(cap: Capture, name: str) -> Column:
    entries: list[Entry] = cap._entries_for(name)
    if any(e.record.index for e in entries):
        raise CaptureError(
            f"{name!r} was saved inside a loop (several arrays per call); read it with "
            f"cap.get({name!r}, call=k) instead of as rows"
        )
    chunks, shapes, dtypes = [], set(), set()
    for entry in entries:
        chunk = _chunk(entry)
        shape = chunk.array.shape if chunk.array is not None else _source(entry).tensor.shape
        if not shape:
            raise CaptureError(f"{name!r} is a scalar per call; it has no rows to read")
        shapes.add(tuple(shape[1:]))
        dtypes.add(chunk.array.dtype if chunk.array is not None else _source(entry).tensor.dtype)
        chunks.append(chunk)
    if len(shapes) > 1:
        raise CaptureError(
            f"the rows of {name!r} change shape between calls ({sorted(shapes)[:4]}); they "
            "cannot be read as one array: pad to one shape, or record with rows=True to "
            "store [batch, seq, d] as [tokens, d]"
        )
    if len(dtypes) > 1:
        raise CaptureError(
            f"the rows of {name!r} change dtype between calls ({sorted(map(str, dtypes))}); "
            f"read each call with cap.get({name!r}, call=k), or record with one dtype"
        )
    return Column(name, dtypes.pop(), shapes.pop(), chunks)


def _source(entry: Entry) -> TensorSource:
    assert isinstance(entry.load, TensorSource)
    return entry.load


def _chunk(entry: Entry) -> Chunk:
    """Where one call's array lies: its file, as ``load`` found it, or the array itself."""
    call = entry.record.call
    if isinstance(entry.load, TensorSource):
        source = entry.load
        rows = source.tensor.shape[0] if source.tensor.shape else 0
        return Chunk(call, rows, source.file, source.tensor.start, None, source.stamp, source.shift)
    array = entry.load()  # a capture in memory, or an array assembled from shards
    return Chunk(call, array.shape[0] if array.shape else 0, None, 0, array)


class LazyArray:
    """``cap.array(name)``: every call's rows as one array, read from disk on indexing.

    Supports ``len``, ``shape``, ``dtype``, numpy's indexing (integers, slices, integer
    arrays, boolean masks, then any further axes; see ``__getitem__``), and
    ``np.asarray`` (reads everything).
    """

    def __init__(self, column: Column) -> None:
        self.column = column

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.column), *self.column.row_shape)

    @property
    def dtype(self) -> np.dtype:
        return self.column.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, key: Any) -> Any:
        """Rows as numpy would index ``np.asarray(self)``, reading only the rows asked for.

        The first index picks rows (an int, a slice, an integer array with negative
        indices counted from the end, or a boolean mask of ``len(self)``); out-of-range
        indices raise IndexError. The rows read are then indexed by numpy itself with the
        whole key, so further axes, broadcasting and errors are numpy's.
        """
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) and key else (key, ())
        if isinstance(key, tuple) and not key:
            first = slice(None)
        if first is None or first is Ellipsis or isinstance(first, bool | np.bool_):
            return np.asarray(self)[key]  # a new axis or ``...`` first: numpy on everything
        rows, local = self._rows(first)
        return rows[(local, *rest)]

    def _rows(self, first: Any) -> tuple[np.ndarray, Any]:
        """The rows ``first`` needs, read, and the index of them that stands for ``first``."""
        n = len(self.column)
        if isinstance(first, slice):
            start, stop, step = first.indices(n)
            if step == 1:
                return self.column.slice(start, stop), slice(None)
            return self.column.take(np.arange(start, stop, step, dtype=np.int64)), slice(None)
        index = np.asarray(first)
        if index.dtype == bool:
            if index.shape != (n,):
                raise IndexError(
                    f"boolean index did not match indexed array along axis 0; size of axis "
                    f"is {n} but size of corresponding boolean axis is "
                    f"{index.shape[0] if index.ndim else 0}"
                    + ("" if index.ndim <= 1 else f" (a mask of {index.ndim} dimensions)")
                )
            wanted = np.flatnonzero(index)
            return self.column.take(wanted), slice(None)
        if index.size == 0 and index.dtype == np.float64:  # an empty list: no rows
            index = index.astype(np.int64)
        if not np.issubdtype(index.dtype, np.integer):
            raise IndexError(
                "only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) and "
                f"integer or boolean arrays are valid indices; got {index.dtype}"
            )
        flat = index.astype(np.int64).reshape(-1)
        bad = (flat < -n) | (flat >= n)
        if bad.any():
            raise IndexError(f"index {int(flat[bad][0])} is out of bounds for axis 0 with size {n}")
        flat = np.where(flat < 0, flat + n, flat)
        if index.ndim == 0:
            return self.column.slice(int(flat[0]), int(flat[0]) + 1), 0
        wanted, local = np.unique(flat, return_inverse=True)
        return self.column.take(wanted), local.reshape(index.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.column.slice(0, len(self.column))
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"LazyArray({self.column.name!r}, shape={self.shape}, dtype={self.dtype})"


def iter_rows(
    cols: tuple[Column, ...],
    batch_size: int,
    *,
    shuffle: bool,
    seed: int | None,
    drop_last: bool,
    start: int,
) -> Iterator[tuple[np.ndarray, ...]]:
    """Batches of rows of ``cols`` together (see ``Capture.iter_batches``)."""
    n = len(cols[0])
    order = np.random.default_rng(seed).permutation(n) if shuffle else None
    stop = n - n % batch_size if drop_last else n
    for lo in range(start * batch_size, stop, batch_size):
        hi = min(lo + batch_size, stop)
        if order is None:
            yield tuple(c.slice(lo, hi) for c in cols)
        else:
            # Sorted within the batch: neighbouring rows share pages.
            rows = np.sort(order[lo:hi])
            yield tuple(c.take(rows) for c in cols)


def convert(array: np.ndarray, fmt: str) -> Any:
    """``array`` as numpy, a torch tensor or a JAX array."""
    if fmt == "numpy":
        return array
    if fmt == "torch":
        import torch

        if array.dtype.name == "bfloat16":
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)
    import jax.numpy as jnp

    return jnp.asarray(array)


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}; got {fmt!r}")


def names_of(names: str | Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """The names asked for, and whether a single name (not a list) was given."""
    if isinstance(names, str):
        return (names,), True
    if isinstance(names, Sequence) and names and all(isinstance(n, str) for n in names):
        return tuple(names), False
    raise TypeError(f"names must be a point name or a non-empty list of them; got {names!r}")
