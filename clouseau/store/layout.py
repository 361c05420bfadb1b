"""The layout of a capture directory: the names of its files and the markers inside them.

One place for what the writer, the reader, the dataset recorder, the distributed parts,
the exporters and the inspector must agree on: ``status.json``, ``graph-NNN.json``, the
default data file pattern, the hidden temporary names files are written under, and the
format marker every file clouseau writes carries in its first bytes. The stored strings
never change: a capture written by an earlier version stays readable.
"""

from __future__ import annotations

import re
from pathlib import Path

from clouseau.ir.errors import ClouseauError
from clouseau.ir.serialize import GRAPH_FORMAT

#: The format marker of a capture: in every safetensors file's metadata and in status.json.
FORMAT = "clouseau.capture/1"
#: The format marker of ``clouseau.record``'s progress record.
RECORD_FORMAT = "clouseau.record/1"

STATUS_FILE = "status.json"
#: Held (flock) by the one writer of a directory; never removed, so never raced.
LOCK_FILE = ".clouseau.lock"
RECORD_FILE = "record.json"
GRAPH_PATTERN = "graph-{:03d}.json"
_GRAPH_NAME = re.compile(r"graph-(\d+)\.json")
#: The default ``filename_pattern`` of the data files.
DEFAULT_PATTERN = "activations-{idx:03d}.safetensors"

#: Temporary files are hidden: ``.<final name>.<8 random characters>.tmp``.
TEMP_SUFFIX = ".tmp"
#: The name of the empty file that checks a directory is writable (created, then removed).
PROBE_NAME = "clouseau-probe"
_TEMP = re.compile(
    rf"\.(?:.+\.(?:safetensors|json)|{re.escape(PROBE_NAME)})\.[a-z0-9_]{{8}}{re.escape(TEMP_SUFFIX)}"
)
#: clouseau's own files state their format within their first bytes.
HEAD_BYTES = 4096
#: The format marker of each kind of file clouseau writes, as it appears in the file.
MARKERS = tuple(
    marker.encode()
    for marker in (f'"{FORMAT}"', f'"format": "{GRAPH_FORMAT}"', f'"format": "{RECORD_FORMAT}"')
)


def graph_file(graph_id: int) -> str:
    """The name of the file holding graph ``graph_id``."""
    return GRAPH_PATTERN.format(graph_id)


def graph_id(name: str) -> int | None:
    """The id of ``name`` if it is exactly a graph file name clouseau writes, else None."""
    match = _GRAPH_NAME.fullmatch(name)
    if match is None or graph_file(int(match.group(1))) != name:
        return None
    return int(match.group(1))


def temp_prefix(name: str) -> str:
    """The start of every temporary name of the file ``name``."""
    return f".{name}."


def is_temp_name(name: str) -> bool:
    """Whether ``name`` may be a temporary file of a clouseau writer (by its form)."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def is_exact_temp_name(name: str) -> bool:
    """Whether ``name`` is exactly the name a clouseau writer gives a temporary file."""
    return _TEMP.fullmatch(name) is not None


def is_named_like_ours(name: str) -> bool:
    """Whether ``name`` is the name of a status, progress or graph file."""
    return name in (STATUS_FILE, RECORD_FILE) or graph_id(name) is not None


def is_capture_file(file: Path, *, strict: bool = False) -> bool:
    """Whether ``file`` is a safetensors file written by clouseau.

    With ``strict``, a damaged file raises CaptureError instead of answering False.
    """
    # Deferred: safetensors_io writes through files, which names its temporaries from here.
    from clouseau.store.safetensors_io import read_header

    try:
        metadata, _ = read_header(file)
    except ClouseauError:
        if strict:
            raise
        return False
    return metadata.get("format") == FORMAT


def escaped(text: object) -> str:
    """``text`` (a path, a name) with control characters escaped, for one line printed or
    raised: a name holding an ESC sequence or a newline cannot forge a terminal line."""
    raw = str(text)
    if raw.isprintable():
        return raw
    return raw.encode("unicode_escape", "backslashreplace").decode("ascii")
