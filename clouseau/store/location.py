"""Where a capture lives: one place that owns what every destination may remove, and when.

Every writer (``instrument``'s directory sink, ``record``, torchrun parts, Ray blocks, the
uploader of an fsspec URL) goes through here for the four things that lose data when each
does them its own way:

- **where**: :func:`resolve` tells a local directory from an fsspec URL (``s3://``,
  ``file://``) and checks the path before anything is created;
- **what may be removed**: :func:`previous_files` lists the files of an earlier capture
  by clouseau's own names, as its ``status.json`` (or a recording's ``record.json``)
  lists them, never by what a file contains: a user's ``NOTES.md`` or
  ``status-before-finetune.json`` is never touched, whatever it mentions;
- **when**: :func:`remove_previous` is called by a writer only once the new run has
  traced and holds the lock (a typo in ``select`` keeps the earlier capture);
- **the exit**: :func:`finalize` closes a writer that the program dropped or left open at
  exit, and names on stderr what could not be written.

The lock of a local directory is :class:`clouseau.store.lock.DirectoryLock`; the lock of a
URL is :class:`clouseau.store.remote.UrlLock`, with the time limits and errors of every
remote call.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clouseau.ir.errors import CaptureError
from clouseau.store.directory import capture_path, file_name, read_status
from clouseau.store.files import read_head
from clouseau.store.layout import (
    HEAD_BYTES,
    MARKERS,
    RECORD_FILE,
    RECORD_FORMAT,
    STATUS_FILE,
    escaped,
    graph_file,
    graph_id,
    is_capture_file,
    is_exact_temp_name,
)

GRAPH_MARKER = MARKERS[1]


def is_url(path: object) -> bool:
    """Whether ``path`` names an fsspec destination (``s3://bucket/run``, ``file:///tmp/x``)."""
    return isinstance(path, str) and "://" in path


@dataclass(frozen=True)
class Location:
    """A capture's destination: a local directory, or an fsspec URL (``url`` set).

    ``path`` is the absolute local directory; None for a URL, whose files are written
    into a local staging directory first.
    """

    path: Path | None
    url: str | None = None

    @property
    def name(self) -> str:
        """The destination as a user wrote it, escaped for a message."""
        return escaped(self.url if self.url is not None else str(self.path))


def resolve(path: str | os.PathLike[str]) -> Location:
    """The :class:`Location` of ``path``; CaptureError naming the fix if it is unusable."""
    if is_url(path):
        return Location(None, str(path).rstrip("/"))
    return Location(capture_path(path))


# -- what an earlier capture holds ------------------------------------------------------
def _plain_names(value: object) -> list[str]:
    """The file names of a status list: plain, visible names only (no path, no dot)."""
    if not isinstance(value, list):
        return []
    return [
        n
        for n in value
        if isinstance(n, str) and n and "/" not in n and "\0" not in n and not n.startswith(".")
    ]


def _continuation(directory: Path, pattern: object, start: int) -> list[str]:
    """Files a writer renamed into place after its status was last written: the next
    names of its own pattern, as long as each is there and is a capture file."""
    found: list[str] = []
    if not isinstance(pattern, str):
        return found
    index = start
    while True:
        try:
            name = file_name(pattern, index)
        except ValueError:
            return found
        file = directory / name
        if not (file.is_file() and not file.is_symlink() and is_capture_file(file)):
            return found
        found.append(name)
        index += 1


def _graph_continuation(directory: Path, start: int) -> list[str]:
    """Graphs written after the status was: the next graph names, each a graph file."""
    found: list[str] = []
    while start + len(found) < 10**6:
        file = directory / graph_file(start + len(found))
        if not (
            file.is_file() and not file.is_symlink() and GRAPH_MARKER in read_head(file, HEAD_BYTES)
        ):
            return found
        found.append(file.name)
    return found


def previous_files(directory: Path) -> frozenset[str]:
    """The names of the files an earlier capture in ``directory`` wrote, as it lists them.

    ``status.json`` lists the data files (and the pattern of their names, for those renamed
    since it was written) and the graphs; a recording's ``record.json`` lists its files
    too. A status of an older clouseau without a graph count: the ``graph-NNN.json`` names.
    The exact temporary names of a writer that was killed are clouseau's as well.
    """
    if not directory.is_dir():
        return frozenset()
    names: set[str] = set()
    status = _read_own(directory, STATUS_FILE, read_status)
    if status is not None:
        names.add(STATUS_FILE)
        files = _plain_names(status.get("files"))
        names.update(files)
        names.update(_continuation(directory, status.get("pattern"), len(files)))
        graphs = status.get("graphs")
        if type(graphs) is int and graphs >= 0:
            names.update(graph_file(i) for i in range(min(graphs, 10**6)))
            names.update(_graph_continuation(directory, graphs))
        else:
            names.update(n for n in os.listdir(directory) if graph_id(n) is not None)
    progress = _read_own(directory, RECORD_FILE, _read_progress)
    if progress is not None:
        names.add(RECORD_FILE)
        files = _plain_names(progress.get("files"))
        names.update(files)
        run = progress.get("run")
        pattern = run.get("filename_pattern") if isinstance(run, dict) else None
        names.update(_continuation(directory, pattern, len(files)))
        if status is None:  # killed before its first status: its graphs by name
            names.update(n for n in os.listdir(directory) if graph_id(n) is not None)
    names.update(n for n in os.listdir(directory) if is_exact_temp_name(n))
    return frozenset(names)


def _read_own(directory: Path, name: str, read: Callable[[Path], Any]) -> Any:
    """``read(directory)``, or None when the file is not clouseau's (then it is in the
    way, and :func:`check_clashes` says so) or is not a regular file."""
    file = directory / name
    if file.is_symlink() or not file.is_file():
        return None
    try:
        return read(directory)
    except CaptureError:
        return None


def _read_progress(directory: Path) -> dict[str, Any] | None:
    from clouseau.store.files import read_json

    file = directory / RECORD_FILE
    if not os.path.lexists(file):
        return None
    data = read_json(file)
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        raise CaptureError(
            f"{escaped(file)} is not a clouseau progress record; it is never removed or "
            "overwritten: move it, or pick another path"
        )
    return data


def check_clashes(directory: Path, mine: Collection[str], removable: Collection[str]) -> None:
    """Refuse a directory holding a file in the way of the new capture (a name it will
    write, ``mine``, or one of clouseau's names) that the earlier capture does not list."""
    if not directory.is_dir():
        return
    for entry in os.scandir(directory):
        name = entry.name
        ours = name in (STATUS_FILE, RECORD_FILE) or graph_id(name) is not None
        if not (ours or name in mine) or name in removable:
            continue
        raise CaptureError(
            f"{escaped(entry.path)} is in the way: the capture would write a file of that "
            "name, and it was not written by clouseau (no earlier capture in the directory "
            "lists it as its own; it is never overwritten or removed). Move it, or pick "
            "another path or filename_pattern"
        )


def remove_previous(directory: Path, names: Collection[str], keep: Collection[str] = ()) -> None:
    """Remove the files ``names`` (from :func:`previous_files`) but ``keep``.

    Call it only once the new run has traced and holds the lock. Links and anything but a
    regular file are left alone.
    """
    for name in sorted(set(names) - set(keep)):
        file = directory / name
        if file.is_symlink() or not file.is_file():
            continue
        try:
            os.unlink(file)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise CaptureError(
                f"cannot remove {escaped(file)} of an earlier capture: {err.strerror or err}; "
                "remove it, or pick another path"
            ) from None


def remove_empty(directory: Path, names: Collection[str]) -> None:
    """Remove ``names`` (clouseau's own files) from ``directory``, then the directory
    itself if nothing else is left in it (a user's file keeps it)."""
    remove_previous(directory, names)
    with contextlib.suppress(OSError):  # not empty: what is left is not ours
        directory.rmdir()


# -- the exit ---------------------------------------------------------------------------
def finalize(owner: object, close: Callable[[], None], where: str) -> weakref.finalize:
    """Close ``owner``'s writer when it is dropped or the program exits without ``close()``.

    ``close`` must not hold ``owner`` (or it is never collected). A failure is one line on
    stderr that names ``where`` and what was not written; it never raises at exit.
    """
    return weakref.finalize(owner, _close_quietly, close, where)


def _close_quietly(close: Callable[[], None], where: str) -> None:
    try:
        close()
    except Exception as err:  # at exit nobody can catch it: say what is lost
        print(f"clouseau: closing the capture at {escaped(where)} failed: {err}", file=sys.stderr)
