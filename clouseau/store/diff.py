"""Compare two captures point by point, in execution order (``clouseau.diff``).

Framework-free: numpy only. Each call of the model is compared with the call of the same
rank in the other capture; inside a call, points follow the execution order of ``a``.
Names of ``a`` are rewritten by ``key_map`` (regular expressions, applied in order like a
sed script) before they are looked up in ``b``, so a PyTorch capture can be compared with
an Equinox one whose names differ.
"""

from __future__ import annotations

import enum
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clouseau.ir.errors import ClouseauError
from clouseau.store.array_stats import as_float

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5

KeyMap = Mapping[str, str] | Sequence[tuple[str, str]] | Callable[[str], str] | None


class DisjointCapturesError(ClouseauError, ValueError):
    """The two captures share no point name, even after ``key_map``."""


class Status(enum.Enum):
    """The verdict on one point."""

    CLOSE = "close"
    DIFFERS = "differs"
    SHAPE = "shape mismatch"
    ONLY_A = "missing in b"
    ONLY_B = "missing in a"

    @property
    def diverges(self) -> bool:
        """Whether the values disagree (missing points are reported, not judged)."""
        return self in (Status.DIFFERS, Status.SHAPE)


@dataclass(frozen=True)
class PointDiff:
    """The comparison of one point in one call.

    ``name`` is the name in ``a`` (``""`` when the point is only in ``b``), ``other`` the
    name in ``b``. ``max_abs`` and ``max_rel`` are over every element (``inf`` where a NaN
    or Inf of one side meets a number of the other); ``exceeding`` counts the elements with
    ``|a - b| > atol + rtol * |b|``.
    """

    name: str
    other: str
    call: int
    status: Status
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    dtype_a: str = ""
    dtype_b: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    exceeding: int = 0
    size: int = 0

    @property
    def label(self) -> str:
        """``name`` or ``name -> other`` when the key map renamed it."""
        if not self.name:
            return self.other
        return self.name if self.other in ("", self.name) else f"{self.name} -> {self.other}"


@dataclass(frozen=True)
class DiffResult:
    """Everything :func:`diff` found: one row per point and call, in execution order."""

    rows: tuple[PointDiff, ...]
    a: str
    b: str
    rtol: float
    atol: float
    strict: bool = False

    @property
    def ok(self) -> bool:
        """No compared point diverges (and, with ``strict``, none is missing on a side)."""
        if self.strict and any(r.status in (Status.ONLY_A, Status.ONLY_B) for r in self.rows):
            return False
        return not any(r.status.diverges for r in self.rows)

    @property
    def first_divergence(self) -> PointDiff | None:
        """The first point, in execution order, whose values differ or whose shape does."""
        return next((r for r in self.rows if r.status.diverges), None)

    @property
    def compared(self) -> tuple[PointDiff, ...]:
        return tuple(r for r in self.rows if r.status not in (Status.ONLY_A, Status.ONLY_B))

    def count(self, status: Status) -> int:
        return sum(r.status is status for r in self.rows)

    @property
    def calls(self) -> tuple[int, ...]:
        return tuple(sorted({r.call for r in self.rows}))

    def summary(self) -> str:
        """One line: the verdict, the counts, and the first diverging point."""
        counts = ", ".join(f"{self.count(s)} {s.value}" for s in Status if self.count(s))
        head = "captures match" if self.ok else "captures DIFFER"
        text = f"{head} (rtol={self.rtol:g}, atol={self.atol:g}): {counts or 'nothing compared'}"
        first = self.first_divergence
        if first is not None:
            text += f"; first divergence: {first.label}" + (
                f" (call {first.call})" if len(self.calls) > 1 else ""
            )
            if first.status is Status.DIFFERS:
                text += f", max abs {first.max_abs:.3g}, max rel {first.max_rel:.3g}, {first.exceeding}/{first.size} exceed"
            else:
                text += f", shape {_shape(first.shape_a)} vs {_shape(first.shape_b)}"
        return text

    def __str__(self) -> str:
        lines = [f"diff {self.a} vs {self.b}"]
        for r in self.rows:
            where = f"[{r.call}] " if len(self.calls) > 1 else ""
            extra = (
                f"  max_abs={r.max_abs:.3g} max_rel={r.max_rel:.3g} exceeding={r.exceeding}"
                if r.status is Status.DIFFERS
                else ""
            )
            lines.append(f"  {where}{r.label}: {r.status.value}{extra}")
        lines.append(self.summary())
        return "\n".join(lines)


def diff(
    a: Any,
    b: Any,
    key_map: KeyMap = None,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    *,
    strict: bool = False,
) -> DiffResult:
    """Compare two captures point by point, in execution order.

    Parameters
    ----------
    a, b
        Captures: a directory written by an instrumented model, a :class:`~clouseau.Capture`,
        or a mapping of name -> array (one call).
    key_map
        How names of ``a`` are spelled in ``b``: ``{pattern: replacement}`` regular
        expressions (``re.sub``, applied in order), a sequence of such pairs, or a
        callable ``name -> name``.
    rtol, atol
        An element is close when ``|a - b| <= atol + rtol * |b|``; NaNs in the same place
        are equal.
    strict
        Count points present on one side only as a difference.

    Returns
    -------
    DiffResult
        ``rows`` (a :class:`PointDiff` per point and call), ``ok``, ``first_divergence``,
        ``summary()``.

    Raises
    ------
    DisjointCapturesError
        No name of ``a`` (after ``key_map``) is in ``b``.
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0; got rtol={rtol}, atol={atol}")
    side_a, side_b = _Side.of(a), _Side.of(b)
    rename = _renamer(key_map)
    rows: list[PointDiff] = []
    matched_any = False
    for call_a, call_b in zip(side_a.calls, side_b.calls, strict=False):
        b_index = {name: rec for rec in side_b.records[call_b] for name in rec.names}
        used: set[int] = set()
        for rec in side_a.records[call_a]:
            pair = next(((n, b_index[rename(n)]) for n in rec.names if rename(n) in b_index), None)
            if pair is None:
                rows.append(
                    PointDiff(
                        rec.names[0],
                        "",
                        call_a,
                        Status.ONLY_A,
                        shape_a=rec.shape,
                        dtype_a=rec.dtype,
                    )
                )
                continue
            matched_any = True
            name, other = pair
            used.add(id(other))
            target = rename(name)
            rows.append(
                compare(name, target, call_a, side_a.load(rec), side_b.load(other), rtol, atol)
            )
        for rec in side_b.records[call_b]:
            if id(rec) not in used:
                rows.append(
                    PointDiff(
                        "",
                        rec.names[0],
                        call_a,
                        Status.ONLY_B,
                        shape_b=rec.shape,
                        dtype_b=rec.dtype,
                    )
                )
    if not matched_any:
        raise DisjointCapturesError(_disjoint_message(side_a, side_b, rename))
    for extra, side, status in (
        (side_a.calls[len(side_b.calls) :], side_a, Status.ONLY_A),
        (side_b.calls[len(side_a.calls) :], side_b, Status.ONLY_B),
    ):
        for call in extra:
            for rec in side.records[call]:
                named = (rec.names[0], "") if status is Status.ONLY_A else ("", rec.names[0])
                rows.append(PointDiff(*named, call, status))
    return DiffResult(tuple(rows), side_a.label, side_b.label, rtol, atol, strict)


def compare(
    name: str, other: str, call: int, x: np.ndarray, y: np.ndarray, rtol: float, atol: float
) -> PointDiff:
    """Compare two arrays; the row :func:`diff` reports for them."""
    x, y = np.asarray(x), np.asarray(y)
    base = dict(name=name, other=other, call=call, shape_a=tuple(x.shape), shape_b=tuple(y.shape),
                dtype_a=str(x.dtype), dtype_b=str(y.dtype), size=int(x.size))  # fmt: skip
    if x.shape != y.shape:
        return PointDiff(status=Status.SHAPE, **base)  # type: ignore[arg-type]
    fx, fy = as_float(x), as_float(y)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.isclose(fx, fy, rtol=rtol, atol=atol, equal_nan=True)
        same = (fx == fy) | (np.isnan(fx) & np.isnan(fy))
        gap = np.where(same, 0.0, np.abs(fx - fy))
        gap = np.where(np.isnan(gap), np.inf, gap)  # a NaN facing a number: infinitely far
        rel = gap / np.maximum(np.abs(fy), np.finfo(np.float64).tiny)
        rel = np.where(gap == 0, 0.0, rel)
    exceeding = int(close.size - np.count_nonzero(close))
    max_abs = float(gap.max()) if gap.size else 0.0
    max_rel = float(np.nan_to_num(rel, nan=math.inf).max()) if rel.size else 0.0
    status = Status.CLOSE if exceeding == 0 else Status.DIFFERS
    return PointDiff(status=status, max_abs=max_abs, max_rel=max_rel, exceeding=exceeding, **base)  # type: ignore[arg-type]


# -- reading either side ------------------------------------------------------------------
@dataclass(frozen=True)
class _Rec:
    names: tuple[str, ...]
    call: int
    shape: tuple[int, ...] | None
    dtype: str


class _Side:
    """One side of the comparison: its calls and, per call, its records in execution order."""

    def __init__(
        self, label: str, records: dict[int, list[_Rec]], loader: Callable[[_Rec], np.ndarray]
    ) -> None:
        self.label = label
        self.records = records
        self.calls = tuple(sorted(records))
        self.load = loader

    @staticmethod
    def of(source: Any) -> _Side:
        from clouseau.store.capture import Capture
        from clouseau.store.reader import load

        if isinstance(source, str | os.PathLike):
            return _Side._of_capture(load(source), str(source))
        if isinstance(source, Capture):
            return _Side._of_capture(source, str(source.path) if source.path else "capture")
        if isinstance(source, Mapping):
            arrays = {str(k): np.asarray(v) for k, v in source.items()}
            recs = [_Rec((k,), 0, tuple(v.shape), str(v.dtype)) for k, v in arrays.items()]
            return _Side("arrays", {0: recs}, lambda r: arrays[r.names[0]])
        raise TypeError(
            f"cannot compare a {type(source).__name__}: pass a capture directory, a Capture or a dict of arrays"
        )

    @staticmethod
    def _of_capture(cap: Any, label: str) -> _Side:
        shapes = _graph_specs(cap)
        by_call: dict[int, dict[tuple[str, ...], _Rec]] = {}
        for record in cap.records:  # sorted by call, order, loop index
            calls = by_call.setdefault(record.call, {})
            if record.names not in calls:
                shape, dtype = shapes.get(record.name, (None, ""))
                calls[record.names] = _Rec(record.names, record.call, shape, dtype)
        records = {call: list(recs.values()) for call, recs in by_call.items()}
        return _Side(label, records, lambda r: np.asarray(cap.get(r.names[0], call=r.call)))


def _graph_specs(cap: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    # Shapes for rows of unmatched points come from the stored IR, so no array is read.
    graph = getattr(cap, "graph", None)
    if graph is None:
        return {}
    return {p.name: (tuple(p.shape), p.dtype.value) for p in graph.points}


def _renamer(key_map: KeyMap) -> Callable[[str], str]:
    if key_map is None:
        return lambda name: name
    if callable(key_map) and not isinstance(key_map, Mapping):
        return key_map
    pairs = list(key_map.items()) if isinstance(key_map, Mapping) else [tuple(p) for p in key_map]
    try:
        compiled = [(re.compile(p), r) for p, r in pairs]
    except re.error as err:
        raise ValueError(f"invalid key map pattern {err.pattern!r}: {err}") from None

    def rename(name: str) -> str:
        for pattern, replacement in compiled:
            name = pattern.sub(replacement, name)
        return name

    return rename


def _disjoint_message(a: _Side, b: _Side, rename: Callable[[str], str]) -> str:
    from clouseau.ir.selection import closest

    names_a = [rename(r.names[0]) for recs in a.records.values() for r in recs]
    names_b = [n for recs in b.records.values() for r in recs for n in r.names]
    if not names_a or not names_b:
        empty = a.label if not names_a else b.label
        return f"{empty} holds no saved point: there is nothing to compare"
    hint = closest(names_a[0], names_b)
    return (
        f"{a.label} and {b.label} share no point name, so nothing can be compared. "
        f"{a.label} has e.g. {', '.join(names_a[:3])}; {b.label} has e.g. {', '.join(names_b[:3])} "
        f"(closest to {names_a[0]!r}: {hint}). Map names of the first onto the second with "
        "key_map={pattern: replacement} (CLI: --key-map PATTERN REPLACEMENT)."
    )


def _shape(shape: tuple[int, ...] | None) -> str:
    return "?" if shape is None else "[" + ",".join(map(str, shape)) + "]"
