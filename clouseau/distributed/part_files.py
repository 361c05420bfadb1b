"""The reader's checks of the metadata files of a capture written in parts.

Every metadata file is read bounded (``store.files.read_json``: a regular file only, never
through a link, never a FIFO or a device, at most its size limit), every field checked
before it is used, and part directories are found without following a link: a damaged or
planted file is a :class:`CaptureError` naming it, the cause and the fix.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from clouseau.ir.errors import CaptureError
from clouseau.store.files import read_json

# The most processes a capture is read for: a damaged manifest claiming 10**9 must not
# make the reader list that many parts (a real job of this size writes 131072 parts).
MAX_WORLD = 2**17


def scan_parts(root: Path, pattern: re.Pattern[str]) -> tuple[list[str], dict[str, str]]:
    """The part directories of ``root`` (real directories, never through a link) and the
    part names that are links, with why they are not read."""
    parts, links = [], {}
    with os.scandir(root) as children:
        for child in children:
            if not pattern.fullmatch(child.name):
                continue
            if child.is_symlink():
                links[child.name] = (
                    "a symbolic link: clouseau never writes one and does not follow it (it "
                    "may point outside the capture); remove it, or record again"
                )
            elif child.is_dir(follow_symlinks=False):
                parts.append(child.name)
    return sorted(parts), links


def is_world(value: object) -> bool:
    return type(value) is int and 1 <= value <= MAX_WORLD


def is_part_summary(part: object) -> bool:
    if not isinstance(part, dict):
        return False
    files, kept = part.get("files"), part.get("calls_kept")
    return (
        isinstance(part.get("name"), str)
        and type(part.get("calls")) is int
        and isinstance(files, list)
        and all(isinstance(f, str) for f in files)
        and (kept is None or (isinstance(kept, list) and all(type(c) is int for c in kept)))
    )


def read_object(file: Path) -> dict[str, Any]:
    """A metadata file of the capture as a JSON object; {} if there is none.

    Bounded as every metadata read is (``store.files.read_json``): a regular file only,
    never through a link, never a FIFO or a device, at most its size limit.
    """
    if not os.path.lexists(file):
        return {}
    data = read_json(file)
    if not isinstance(data, dict):
        raise CaptureError(f"{file} is damaged (not a JSON object); record again")
    return data
