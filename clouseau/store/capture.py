"""The in-Python view of a capture: a Mapping of point name -> numpy array."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clouseau.ir.errors import ClouseauError
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
        return [self.key, list(self.names), self.node, self.call, self.order, self.graph, list(self.index)]

    @staticmethod
    def from_json(item: list[Any]) -> Record:
        key, names, node, call, order, graph, index = item
        return Record(str(key), tuple(map(str, names)), str(node), int(call), int(order), int(graph), tuple(map(int, index)))


def tensor_key(name: str, call: int, index: tuple[int, ...]) -> str:
    """The key of an array inside a safetensors file: ``<name>#<call>`` (``@i`` per loop index)."""
    return f"{name}#{call}" + "".join(f"@{i}" for i in index)


def encode_records(records: list[Record]) -> str:
    return json.dumps([r.to_json() for r in records], separators=(",", ":"))


class AmbiguousPointError(ClouseauError, KeyError):
    """A name was captured in several calls; ``cap.get(name, call=k)`` says which one."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Entry:
    record: Record
    load: Callable[[], np.ndarray]


class Capture(Mapping[str, np.ndarray]):
    """The activations of one capture, by point name.

    ``cap[name]`` is the array of a name captured in a single call (stacked over loop
    iterations when captured inside ``scan``); ``cap.get(name, call=k)`` picks a call.
    Iteration follows execution order. ``cap.graph`` is the traced IR.
    """

    def __init__(
        self,
        entries: tuple[Entry, ...],
        graphs: tuple[Graph, ...] = (),
        failed_calls: Mapping[int, str] | None = None,
        path: Path | None = None,
    ) -> None:
        self._entries = tuple(sorted(entries, key=lambda e: (e.record.call, e.record.order, e.record.index)))
        self.graphs = graphs
        self.failed_calls: dict[int, str] = dict(failed_calls or {})
        self.path = path
        self._by_name: dict[str, list[Entry]] = {}
        for entry in self._entries:
            for name in entry.record.names:
                self._by_name.setdefault(name, []).append(entry)

    @property
    def graph(self) -> Graph | None:
        """The IR of the first traced signature (``graphs`` holds all of them)."""
        return self.graphs[0] if self.graphs else None

    @property
    def records(self) -> tuple[Record, ...]:
        return tuple(e.record for e in self._entries)

    @property
    def calls(self) -> tuple[int, ...]:
        """The call indices that saved something, in order."""
        return tuple(sorted({e.record.call for e in self._entries}))

    def names(self) -> tuple[str, ...]:
        """Every captured point name, in execution order."""
        return tuple(self._by_name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> np.ndarray:
        entries = self._entries_for(name)
        calls = {e.record.call for e in entries}
        if len(calls) > 1:
            raise AmbiguousPointError(
                f"{name!r} was captured in {len(calls)} calls ({_span(calls)}); "
                f"pick one with cap.get({name!r}, call=k)"
            )
        return _stack(entries)

    def get(  # type: ignore[override]
        self, name: str, default: Any = None, *, call: int | None = None, index: tuple[int, ...] | None = None
    ) -> Any:
        """The array of ``name`` in ``call`` (and loop ``index``); ``default`` if absent."""
        if name not in self._by_name:
            return default
        if call is None:
            return self[name]
        entries = [e for e in self._by_name[name] if e.record.call == call]
        if index is not None:
            entries = [e for e in entries if e.record.index == tuple(index)]
        return _stack(entries) if entries else default

    def all_calls(self, name: str) -> list[np.ndarray]:
        """The arrays of ``name``, one per call, in call order."""
        entries = self._entries_for(name)
        return [_stack([e for e in entries if e.record.call == c]) for c in sorted({e.record.call for e in entries})]

    def _entries_for(self, name: str) -> list[Entry]:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{name!r} is not in this capture; closest: {closest(name, self._by_name)}") from None

    def __repr__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return f"<Capture{where}: {len(self)} points, {len(self.calls)} call(s)>"


def _stack(entries: list[Entry]) -> np.ndarray:
    if len(entries) == 1 and not entries[0].record.index:
        return entries[0].load()
    return np.stack([e.load() for e in sorted(entries, key=lambda e: e.record.index)])


def _span(calls: set[int]) -> str:
    ordered = sorted(calls)
    return ", ".join(map(str, ordered)) if len(ordered) <= 5 else f"{ordered[0]}..{ordered[-1]}"
