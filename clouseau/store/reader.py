"""``clouseau.load``: read a capture directory (or one of its files) into a Capture."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from clouseau.ir.errors import CaptureError, ClouseauError
from clouseau.ir.graph import Graph
from clouseau.store.capture import Capture, Entry, Record
from clouseau.store.safetensors_io import TensorEntry, read_array, read_header
from clouseau.store.writer import FORMAT, GRAPH_PATTERN, STATUS_FILE


def load(path: str | Path) -> Capture:
    """Load a capture written by an instrumented model.

    Parameters
    ----------
    path
        A capture directory, or a single ``.safetensors`` file of one.

    Returns
    -------
    Capture
        A Mapping of point name -> numpy array (arrays are read lazily), with ``calls``,
        ``graph`` and ``failed_calls``.
    """
    path = Path(path)
    if path.is_file():
        return _load_files(path.parent, (path,))
    if not path.is_dir():
        raise CaptureError(f"{path} does not exist; pass the directory given to clouseau.instrument(path=...)")
    files = tuple(sorted(f for f in path.glob("*.safetensors") if not f.name.startswith(".")))
    capture_files = tuple(f for f in files if is_capture_file(f, strict=True))
    if not capture_files and not (path / STATUS_FILE).exists():
        raise CaptureError(
            f"{path} is not a clouseau capture: it has no .safetensors files written by clouseau "
            f"({len(files)} other .safetensors file(s)) and no {STATUS_FILE}. Point load() at the "
            "directory given to clouseau.instrument(path=...)."
        )
    return _load_files(path, capture_files)


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
            raise CaptureError(f"{file} was not written by clouseau (no clouseau metadata); read it with safetensors")
        by_key = {t.key: t for t in tensors}
        for record in _records(file, metadata):
            tensor = by_key.get(record.key)
            if tensor is None:
                raise CaptureError(f"{file}: the metadata lists {record.key!r} but the file does not hold it")
            entries.append(Entry(record, partial(_read, file, tensor)))
    return Capture(tuple(entries), _graphs(directory), _failed_calls(directory), directory)


def _read(file: Path, tensor: TensorEntry):  # noqa: ANN202
    return read_array(file, tensor)


def _records(file: Path, metadata: dict[str, str]) -> list[Record]:
    try:
        return [Record.from_json(item) for item in json.loads(metadata["clouseau"])]
    except (KeyError, ValueError, TypeError) as err:
        raise CaptureError(f"{file}: the clouseau metadata is damaged ({type(err).__name__}: {err})") from None


def _graphs(directory: Path) -> tuple[Graph, ...]:
    graphs = []
    index = 0
    while (file := directory / GRAPH_PATTERN.format(index)).exists():
        try:
            graphs.append(Graph.from_json(json.loads(file.read_text())))
        except (ValueError, KeyError, TypeError) as err:
            raise CaptureError(f"{file} is damaged ({type(err).__name__}: {err})") from None
        index += 1
    return tuple(graphs)


def _failed_calls(directory: Path) -> dict[int, str]:
    file = directory / STATUS_FILE
    if not file.exists():
        return {}
    try:
        status = json.loads(file.read_text())
        return {int(k): str(v) for k, v in status.get("failed_calls", {}).items()}
    except (ValueError, AttributeError, TypeError) as err:
        raise CaptureError(f"{file} is damaged ({type(err).__name__}: {err})") from None
