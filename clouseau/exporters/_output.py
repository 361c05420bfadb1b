"""Files the exporters write (pages, drawings, DOT text): whole, exclusive, never through a link.

A predictable temporary name beside the output (``.report.html.<pid>.tmp``) lets anyone
who can write to the directory plant a link there and have the page written through it
(over ``~/.bashrc``). The temporary file is created the way the store creates its own
(``store.files.temp_file``: an unpredictable name, ``O_CREAT|O_EXCL``, no link followed)
and renamed over the output, which replaces a planted link itself, never its target.
"""

from __future__ import annotations

import os
from pathlib import Path

from clouseau.store.files import temp_file


def write_output(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (an exclusive temporary file, then a rename)."""
    fd, tmp = temp_file(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
