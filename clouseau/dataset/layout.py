"""The token-level layout of ``clouseau.record``: ``[batch, seq, ...]`` stored as rows.

A point stored as rows keeps only the positions the mask marks (padding dropped) and is
flattened to ``[tokens, ...]``, in row-major order (sample by sample, position by
position). Beside it every batch stores the fields ``sample`` (the index of the row's
sample in the data) and ``position`` (its position in the sequence), and any per-row
fields the user asks for (token ids), masked the same way, so each row traces back to
its sample and position.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clouseau.dataset.fingerprint import to_numpy

FieldSource = str | Callable[[Any], Any]
SAMPLE, POSITION = "sample", "position"


@dataclass(frozen=True)
class Layout:
    """How record stores each point: ``rows`` (globs, or all with ``("*",)``), mask, fields."""

    rows: tuple[str, ...] = ()
    mask: FieldSource | None = None
    fields: tuple[tuple[str, FieldSource], ...] = ()

    @staticmethod
    def make(
        rows: bool | str | Sequence[str],
        mask: FieldSource | None,
        fields: Sequence[str] | Mapping[str, FieldSource] | None,
    ) -> Layout:
        if rows is True:
            globs: tuple[str, ...] = ("*",)
        elif rows is False or rows is None:
            globs = ()
        elif isinstance(rows, str):
            globs = (rows,)
        elif isinstance(rows, Sequence) and all(isinstance(r, str) for r in rows):
            globs = tuple(rows)
        else:
            raise TypeError(
                f"rows must be True, False, a glob or a list of globs over the selected "
                f"points; got {rows!r}"
            )
        if mask is not None and not (isinstance(mask, str) or callable(mask)):
            raise TypeError(
                f"mask must be a key of the batch (e.g. 'attention_mask') or a function "
                f"batch -> [batch, seq] array; got {mask!r}"
            )
        if mask is not None and not globs:
            raise ValueError("mask= drops padding rows, so it needs rows=True (or rows=globs)")
        if isinstance(fields, Mapping):
            pairs = tuple((str(k), v) for k, v in fields.items())
        elif fields is None:
            pairs = ()
        elif isinstance(fields, Sequence) and not isinstance(fields, str):
            pairs = tuple((str(k), str(k)) for k in fields)
        else:
            raise TypeError(
                f"fields must be a list of batch keys or a dict name -> key or function; "
                f"got {fields!r}"
            )
        reserved = {SAMPLE, POSITION} & {name for name, _ in pairs} if globs else set()
        if reserved:
            raise ValueError(f"the fields {sorted(reserved)} are stored by the rows layout itself")
        return Layout(globs, mask, pairs)

    def describe(self) -> dict[str, Any]:
        """What a resumed run must keep the same (functions by name)."""
        return {
            "rows": list(self.rows),
            "mask": _describe(self.mask),
            "fields": [[n, _describe(s)] for n, s in self.fields],
        }

    def is_rows(self, names: tuple[str, ...]) -> bool:
        """Whether a value is stored as rows: a glob matches any of its names (a module
        output is often another value's alias on the traced path, ``model.layers.0``)."""
        return any(fnmatch.fnmatchcase(n, glob) for n in names for glob in self.rows)


def _describe(source: FieldSource | None) -> str | None:
    if source is None or isinstance(source, str):
        return source
    return getattr(source, "__qualname__", type(source).__name__)


def take(batch: Any, source: FieldSource, what: str) -> np.ndarray:
    """The array ``source`` picks from ``batch`` (a key, or a function of the batch)."""
    if callable(source):
        return to_numpy(source(batch))
    if not isinstance(batch, Mapping) or source not in batch:
        keys = list(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise KeyError(
            f"the {what} {source!r} is not a key of the batch ({keys}); pass a key of a dict "
            f"batch, or a function batch -> array"
        )
    return to_numpy(batch[source])


class BatchRows:
    """The rows layout of one batch: shapes points into rows, then builds the fields."""

    def __init__(self, layout: Layout, mask: np.ndarray | None) -> None:
        self.layout = layout
        self.mask = None if mask is None else mask.astype(bool)
        self.grid: tuple[int, int] | None = None if mask is None else mask.shape[:2]

    def __call__(self, names: tuple[str, ...], array: np.ndarray) -> np.ndarray:
        if not self.layout.is_rows(names):
            return array
        name = next((n for n in names if self.layout.is_rows((n,))), names[0])
        if array.ndim < 2 or (self.grid is not None and array.shape[:2] != self.grid):
            expected = (
                f"[{self.grid[0]}, {self.grid[1]}, ...]" if self.grid else "[batch, seq, ...]"
            )
            raise ValueError(
                f"point {name!r} has shape {list(array.shape)}, which is not {expected} "
                f"(the mask's batch and sequence axes); store it as it is by leaving it out "
                f"of rows=, e.g. rows=['h.*']"
            )
        grid = (int(array.shape[0]), int(array.shape[1]))
        self.grid = grid
        flat = array.reshape(grid[0] * grid[1], *array.shape[2:])
        return flat if self.mask is None else flat[self.mask.reshape(-1)]

    def fields(self, batch: Any, first_sample: int) -> list[tuple[str, np.ndarray]]:
        """``sample``, ``position`` and the user's fields, masked like the rows."""
        out = []
        if self.layout.rows and self.grid is None:
            raise ValueError(
                f"rows={list(self.layout.rows)} matched none of the saved points of this "
                "batch; pass globs of selected points (or rows=True for all)"
            )
        if self.layout.rows and self.grid is not None:
            b, s = self.grid
            out.append((SAMPLE, self._rows(np.arange(first_sample, first_sample + b)[:, None])))
            out.append((POSITION, self._rows(np.arange(s)[None, :])))
        for name, source in self.layout.fields:
            value = take(batch, source, "field")
            out.append((name, self._rows(value) if self.layout.rows else value))
        return out

    def _rows(self, value: np.ndarray) -> np.ndarray:
        assert self.grid is not None
        b, s = self.grid
        if value.ndim == 1:
            value = value[:, None]
        grid = np.broadcast_to(value, (b, s, *value.shape[2:]))
        flat = grid.reshape(b * s, *value.shape[2:])
        return np.ascontiguousarray(flat if self.mask is None else flat[self.mask.reshape(-1)])
