"""``clouseau.load``: read a capture directory (or one of its files) into a Capture."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

from clouseau.ir.errors import CaptureError, ClouseauError
from clouseau.ir.graph import Graph
from clouseau.store.capture import Capture, Entry, Record
from clouseau.store.safetensors_io import TensorEntry, read_array, read_header
from clouseau.store.writer import FORMAT, GRAPH_PATTERN, STATUS_FILE

# What parsing damaged JSON into the IR may raise; each becomes a CaptureError.
_PARSE_ERRORS = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError)


def load(path: str | os.PathLike[str]) -> Capture:
    """Load a capture written by an instrumented model.

    Parameters
    ----------
    path
        A capture directory, or a single ``.safetensors`` file of one.

    Returns
    -------
    Capture
        A Mapping of point name -> numpy array (arrays are read lazily, on access), with
        ``calls``, ``graph``, ``graphs`` and ``failed_calls``.

    Raises
    ------
    CaptureError
        ``path`` does not exist, is not a capture, or holds a damaged file (the message
        names the file and what is wrong with it).
    """
    if isinstance(path, str) and "://" in path:
        from clouseau.distributed.remote import load_url  # fsspec only when asked for

        return load_url(path)
    path = Path(path)
    if path.is_dir():
        from clouseau.distributed.parts import is_parted, load_parts

        if is_parted(path):
            return load_parts(path)
    if path.is_file():
        return _load_files(path.parent, (path,))
    if not path.is_dir():
        raise CaptureError(
            f"{path} does not exist; pass the directory given to clouseau.instrument(path=...)"
        )
    # Regular files only: opening a FIFO named *.safetensors would block forever.
    # Hidden files are the temporary files of a writer (never complete ones).
    files = sorted(
        f for f in path.glob("*.safetensors") if f.is_file() and not f.name.startswith(".")
    )
    headers = [(f, *read_header(f)) for f in files]
    ours = tuple((f, m, t) for f, m, t in headers if m.get("format") == FORMAT)
    if not ours and not (path / STATUS_FILE).is_file():
        raise CaptureError(
            f"{path} is not a clouseau capture: it has no .safetensors files written by "
            f"clouseau ({len(files)} other .safetensors file(s)) and no {STATUS_FILE}. Point "
            "load() at the directory given to clouseau.instrument(path=...)."
        )
    entries = [entry for file, meta, tensors in ours for entry in _entries(file, meta, tensors)]
    return Capture(tuple(entries), _graphs(path), _failed_calls(path), path)


def is_capture_file(file: Path, *, strict: bool = False) -> bool:
    """Whether ``file`` is a safetensors file written by clouseau.

    With ``strict``, a damaged file raises CaptureError instead of answering False.
    """
    try:
        metadata, _ = read_header(file)
    except ClouseauError:
        if strict:
            raise
        return False
    return metadata.get("format") == FORMAT


def _load_files(directory: Path, files: tuple[Path, ...]) -> Capture:
    entries: list[Entry] = []
    for file in files:
        metadata, tensors = read_header(file)
        if metadata.get("format") != FORMAT:
            raise CaptureError(
                f"{file} was not written by clouseau (no clouseau metadata); "
                "read it with safetensors"
            )
        entries.extend(_entries(file, metadata, tensors))
    return Capture(tuple(entries), _graphs(directory), _failed_calls(directory), directory)


def _entries(file: Path, metadata: dict[str, str], tensors: tuple[TensorEntry, ...]) -> list[Entry]:
    by_key = {t.key: t for t in tensors}
    entries = []
    for record in _records(file, metadata):
        tensor = by_key.get(record.key)
        if tensor is None:
            raise CaptureError(
                f"{file}: the metadata lists {record.key!r} but the file does not hold it"
            )
        entries.append(Entry(record, partial(read_array, file, tensor)))
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


def _graphs(directory: Path) -> tuple[Graph, ...]:
    graphs = []
    index = 0
    while (file := directory / GRAPH_PATTERN.format(index)).is_file():
        try:
            graphs.append(Graph.from_json(json.loads(file.read_text())))
        except OSError as err:
            raise CaptureError(f"cannot read {file}: {err.strerror or err}") from None
        except _PARSE_ERRORS as err:
            raise CaptureError(f"{file} is damaged ({type(err).__name__}: {err})") from None
        index += 1
    return tuple(graphs)


def _failed_calls(directory: Path) -> dict[int, str]:
    file = directory / STATUS_FILE
    if not file.is_file():
        return {}
    try:
        status = json.loads(file.read_text())
        return {int(k): str(v) for k, v in status.get("failed_calls", {}).items()}
    except OSError as err:
        raise CaptureError(f"cannot read {file}: {err.strerror or err}") from None
    except _PARSE_ERRORS as err:
        raise CaptureError(f"{file} is damaged ({type(err).__name__}: {err})") from None
