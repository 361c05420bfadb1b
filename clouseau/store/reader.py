"""``clouseau.load``: read a capture directory (or one of its files) into a Capture.

A directory may be damaged (a truncated file, a file lost, a crash mid-write) or hold
files planted by someone else (links, FIFOs, huge JSON). Loading reads what is whole, opens
only regular files and never follows a link, and reports the rest in ``cap.damaged`` (a
warning; ``strict=True`` raises instead). Calls whose values are not all on disk are in
``cap.partial_calls``.
"""

from __future__ import annotations

import gc
import json
import os
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from clouseau.ir.errors import CaptureError, ClouseauError
from clouseau.ir.graph import Graph
from clouseau.ir.verify import verify
from clouseau.store.capture import Capture, Entry, Record
from clouseau.store.directory import read_status
from clouseau.store.files import read_json
from clouseau.store.graphcheck import check_types
from clouseau.store.layout import FORMAT, RECORD_FILE, STATUS_FILE, graph_file, graph_id
from clouseau.store.safetensors_io import TensorEntry, read_header
from clouseau.store.sources import Stamp, TensorSource

# What parsing damaged JSON into the IR may raise; each becomes a CaptureError.
_PARSE_ERRORS = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError)
_CALLS = re.compile(r"\[(\d+(?:,\d+)*)?\]")


class DamagedCaptureWarning(UserWarning):
    """``clouseau.load`` skipped damaged files of a capture (listed in ``cap.damaged``)."""


# Layouts written beyond one process (torchrun parts, Ray blocks, URLs) are read by the
# package that writes them, which registers its opener here: the store knows no engine.
# An opener returns None for a path that is not of its layout.
Opener = Callable[[str | Path, bool], Capture | None]
_OPENERS: list[Opener] = []


def register_opener(opener: Opener) -> None:
    """Let ``load`` read another layout: ``opener(path, strict)`` returns its capture or None."""
    if opener not in _OPENERS:
        _OPENERS.append(opener)


def load(path: str | os.PathLike[str], *, strict: bool = False) -> Capture:
    """Load a capture written by an instrumented model.

    Parameters
    ----------
    path
        A capture directory, or a single ``.safetensors`` file of one.
    strict
        Raise if any file of the directory is damaged or missing. By default the whole
        files load, the others are listed in ``cap.damaged`` and a
        :class:`DamagedCaptureWarning` says so.

    Returns
    -------
    Capture
        A Mapping of point name -> numpy array (arrays are read lazily, on access), with
        ``calls``, ``graph``, ``graphs``, ``failed_calls``, ``partial_calls``, ``damaged``,
        ``closed`` and ``complete``.

    Raises
    ------
    CaptureError
        ``path`` does not exist or is not a capture; with ``strict``, a damaged file (the
        message names each file and what is wrong with it).
    """
    for opener in _OPENERS:
        found = opener(path, strict)
        if found is not None:
            return found
    path = Path(path)
    if path.is_file():
        return _load_file(path)
    if not path.is_dir():
        raise CaptureError(
            f"{path} does not exist; pass the directory given to clouseau.instrument(path=...)"
        )
    scan = _Scan(path)
    with _collector_paused():
        scan.run()
    if not (scan.files or scan.status is not None or scan.graphs or scan.damaged):
        raise CaptureError(
            f"{path} is not a clouseau capture: it has no .safetensors files written by "
            f"clouseau ({scan.foreign} other .safetensors file(s)) and no {STATUS_FILE}. Point "
            "load() at the directory given to clouseau.instrument(path=...)."
        )
    if scan.damaged:
        listing = "; ".join(f"{name}: {why}" for name, why in sorted(scan.damaged.items()))
        if strict:
            raise CaptureError(f"{path} holds damaged files: {listing}")
        warnings.warn(
            f"{path}: skipped {len(scan.damaged)} damaged file(s) (cap.damaged lists them; "
            f"load(..., strict=True) raises instead): {listing}",
            DamagedCaptureWarning,
            stacklevel=2,
        )
    with _collector_paused():
        return scan.capture()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while headers are parsed.

    Loading makes a few objects per file that all stay alive (records, entries), and each
    collection the allocation count triggers walks every one made before: with the
    collector on, 40,000 files took 4.4x the time of 10,000 and a third of it was the
    collector's. Nothing made here forms a cycle, so nothing is left for it to find.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class _File:
    """One readable clouseau file: its entries and the calls it leaves open or closes."""

    name: str
    entries: tuple[Entry, ...]
    open: frozenset[int]
    done: frozenset[int]


class _Scan:
    """Everything found in a capture directory, and what is wrong with it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files: list[_File] = []
        self.damaged: dict[str, str] = {}
        self.graphs: dict[int, Graph] = {}
        self.status: dict[str, object] | None = None
        self.foreign = 0
        self.graph_tuple: tuple[Graph, ...] = ()

    def run(self) -> None:
        names = sorted(os.listdir(self.path))
        present = set(names)  # a set: load stays linear in the number of files
        try:
            self.status = read_status(self.path)
        except CaptureError as err:
            self.damaged[STATUS_FILE] = str(err)
        for name in names:
            if name.startswith("."):  # a writer's temporary files, never complete ones
                continue
            if name.endswith(".safetensors"):
                self._read_file(name)
            elif (graph := graph_id(name)) is not None:
                self._read_graph(name, graph)
        listed = self.status.get("files", []) if self.status else []
        for name in listed if isinstance(listed, list) else ():
            if isinstance(name, str) and name not in present:
                self.damaged[name] = "missing: status.json lists it as written"
        for name in _recorded_files(self.path) if RECORD_FILE in present else ():
            if name not in present:  # a recording's progress record lists every file
                self.damaged.setdefault(name, f"missing: {RECORD_FILE} lists it as written")
        self._drop_duplicates()
        self.graph_tuple = self._graph_tuple()

    def _read_file(self, name: str) -> None:
        file = self.path / name
        try:
            stamp = _stamp(file)
            metadata, tensors = read_header(file)
        except CaptureError as err:
            self.damaged[name] = str(err)
            return
        if metadata.get("format") != FORMAT:
            self.foreign += 1
            return
        try:
            entries = _entries(file, metadata, tensors, stamp)
            marks = _calls(metadata.get("open")), _calls(metadata.get("done"))
        except CaptureError as err:
            self.damaged[name] = str(err)
            return
        self.files.append(_File(name, tuple(entries), *marks))

    def _read_graph(self, name: str, graph_id: int) -> None:
        try:
            self.graphs[graph_id] = read_graph(self.path / name)
        except CaptureError as err:
            self.damaged[name] = str(err)

    def _drop_duplicates(self) -> None:
        seen: dict[str, str] = {}
        kept = []
        for file in self.files:
            keys = [e.record.key for e in file.entries]
            twice = next((k for k in keys if k in seen), None)
            if twice is not None:
                self.damaged[file.name] = (
                    f"a duplicate: it holds {twice!r}, which {seen[twice]} holds already"
                )
                continue
            seen.update(dict.fromkeys(keys, file.name))
            kept.append(file)
        self.files = kept

    def capture(self) -> Capture:
        status = self.status or {}
        entries = tuple(e for f in self.files for e in f.entries)
        failed = _int_keyed(status.get("failed_calls"))
        partial = _partial_calls(self.files, status, failed)
        calls = status.get("calls")
        if type(calls) is int and entries:
            # The status lags the files by up to flush_s: a call on disk was made.
            calls = max(calls, max(e.record.call for e in entries) + 1)
        return Capture(
            entries,
            self.graph_tuple,
            failed,
            self.path,
            partial_calls=partial,
            damaged=self.damaged,
            calls_made=calls if type(calls) is int else None,
            closed=status.get("closed") is True,
        )

    def _graph_tuple(self) -> tuple[Graph, ...]:
        # Graph ids from 0 up: a gap (a graph lost) ends the tuple, and is reported.
        out = []
        for number in range(len(self.graphs)):
            if number not in self.graphs:
                name = graph_file(number)
                self.damaged.setdefault(name, "missing: later graphs exist")
                break
            out.append(self.graphs[number])
        return tuple(out)


def _partial_calls(
    files: list[_File], status: dict[str, object], failed: dict[int, str]
) -> dict[int, str]:
    """The calls not whole on disk: cut by a file and never marked done, or lost."""
    ended = set(_as_ints(status.get("done")))
    seen: set[int] = set()
    for file in files:
        ended |= file.done
        calls = {e.record.call for e in file.entries}
        seen |= calls
        ended |= calls - file.open
    partial = {
        call: "incomplete: the process stopped before all its values were written"
        for call in sorted(seen - ended - set(failed))
    }
    partial.update(_int_keyed(status.get("lost_calls")))
    return partial


def _recorded_files(path: Path) -> list[str]:
    """The files a recording's ``record.json`` lists (none if it is not one)."""
    try:
        progress = read_json(path / RECORD_FILE)
    except CaptureError:
        return []
    files = progress.get("files") if isinstance(progress, dict) else None
    return [f for f in files if isinstance(f, str)] if isinstance(files, list) else []


def _calls(text: object) -> frozenset[int]:
    if text is None:
        return frozenset()
    if not isinstance(text, str) or not _CALLS.fullmatch(text):
        raise CaptureError(f"the clouseau metadata is damaged (call list {text!r:.60})")
    return frozenset(int(c) for c in text[1:-1].split(",") if c)


def _as_ints(value: object) -> list[int]:
    return [v for v in value if type(v) is int] if isinstance(value, list) else []


def _int_keyed(value: object) -> dict[int, str]:
    if not isinstance(value, dict):
        return {}
    return {int(k): str(v) for k, v in value.items() if isinstance(k, str) and k.isdigit()}


def _load_file(file: Path) -> Capture:
    stamp = _stamp(file)
    metadata, tensors = read_header(file)
    if metadata.get("format") != FORMAT:
        raise CaptureError(
            f"{file} was not written by clouseau (no clouseau metadata); read it with safetensors"
        )
    directory = file.parent
    scan = _Scan(directory)
    entries = _entries(file, metadata, tensors, stamp)
    for name in sorted(os.listdir(directory)):
        if (graph := graph_id(name)) is not None:
            scan._read_graph(name, graph)
    try:
        status = read_status(directory) or {}
    except CaptureError:
        status = {}
    failed = _int_keyed(status.get("failed_calls"))
    return Capture(tuple(entries), scan._graph_tuple(), failed, directory)


def file_entries(file: Path) -> list[Entry]:
    """The arrays of one clouseau file: its header read, checked and stamped.

    Raises
    ------
    CaptureError
        The file is damaged, a link, not a regular file, or not written by clouseau.
    """
    stamp = _stamp(file)
    metadata, tensors = read_header(file)
    if metadata.get("format") != FORMAT:
        raise CaptureError(f"{file} was not written by clouseau (no clouseau metadata)")
    return _entries(file, metadata, tensors, stamp)


def _stamp(file: Path) -> Stamp:
    # Taken before the header is read: a file replaced in between fails the check of its
    # first read instead of lending the old header to the new bytes.
    stamp = Stamp.current(file)
    if stamp is None:
        raise CaptureError(f"{file} vanished while the capture was loaded")
    return stamp


def _entries(
    file: Path, metadata: dict[str, str], tensors: tuple[TensorEntry, ...], stamp: Stamp
) -> list[Entry]:
    by_key = {t.key: t for t in tensors}
    entries = []
    for record in _records(file, metadata):
        tensor = by_key.get(record.key)
        if tensor is None:
            raise CaptureError(
                f"{file}: the metadata lists {record.key!r} but the file does not hold it"
            )
        entries.append(Entry(record, TensorSource(file, tensor, stamp)))
    return entries


def _records(file: Path, metadata: dict[str, str]) -> list[Record]:
    try:
        items = json.loads(metadata["clouseau"])
        if not isinstance(items, list):
            raise TypeError("the record list is not a JSON list")
        return [Record.from_json(item) for item in items]
    except (KeyError, ValueError, TypeError, RecursionError) as err:
        raise CaptureError(
            f"{file}: the clouseau metadata is damaged ({type(err).__name__}: {err})"
        ) from None


def graph_of(path: Path) -> Graph:
    """The graph to draw for a capture directory (its first graph) or a graph JSON file."""
    if path.is_dir():
        file = path / graph_file(0)
        if not os.path.lexists(file):
            raise CaptureError(
                f"{path} holds no {file.name}: it is not a clouseau capture directory (or the "
                "model was never called). Pass the directory given to clouseau.instrument(path=...)"
            )
        return read_graph(file)
    if path.suffix == ".json" and path.exists():
        return read_graph(path.resolve())  # a link the user names is theirs to follow
    raise CaptureError(
        f"{path} does not exist; pass a capture directory, a Graph or an instrumented model"
    )


def read_graph(file: Path) -> Graph:
    """The IR stored in ``file``, checked by the verifier; one CaptureError if damaged."""
    data = read_json(file)
    try:
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        graph = Graph.from_json(data)
        check_types(graph)
        return verify(graph)
    except ClouseauError as err:
        raise CaptureError(f"{file} is damaged ({err})") from None
    except _PARSE_ERRORS as err:
        raise CaptureError(f"{file} is damaged ({type(err).__name__}: {err})") from None
