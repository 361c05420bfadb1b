"""Careful file operations for a capture directory that others may write to.

A capture directory can hold files planted by someone else: links to files elsewhere,
FIFOs, devices, or huge sparse files. Every file clouseau creates is created exclusively
under an unpredictable name (``O_CREAT|O_EXCL|O_NOFOLLOW``, through ``tempfile.mkstemp``)
and renamed into place without replacing anything; every file it reads is opened without
following a link, must be a regular file, and JSON is read up to a size limit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from clouseau.ir.errors import CaptureError
from clouseau.store.layout import TEMP_SUFFIX, temp_prefix

MAX_JSON_BYTES = 256 * 2**20  # far above the IR of any real model; /dev/zero stops here
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, which must be a regular file and not a link.

    Non-blocking open, so that a FIFO answers at once (and is then refused) instead of
    waiting forever for a writer.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise CaptureError(
                f"{path} is a symbolic link; clouseau never writes links into a capture and "
                "does not follow them (it may point outside the directory): remove it"
            ) from None
        raise CaptureError(f"cannot read {path}: {err.strerror or err}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CaptureError(
            f"{path} is not a regular file ({_kind(mode)}); clouseau reads only the regular "
            "files it wrote: remove it"
        )
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """Parse the JSON file ``path`` (a regular file of at most ``limit`` bytes)."""
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb") as f:
            # The size first: a huge (or sparse) file is refused without reading it.
            size = os.fstat(f.fileno()).st_size
            raw = f.read(limit + 1) if size <= limit else b""
    except OSError as err:
        raise CaptureError(f"cannot read {path}: {err.strerror or err}") from None
    if size > limit or len(raw) > limit:
        raise CaptureError(
            f"{path} is damaged: larger than {limit // 2**20} MiB, which no file clouseau "
            "writes reaches"
        )
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CaptureError(f"{path} is damaged (not valid JSON: {_short(err)})") from None


def read_head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (a regular file, not a link), b"" if unreadable."""
    try:
        fd = open_regular(path)
    except CaptureError:
        return b""
    try:
        return os.read(fd, size)
    except OSError:
        return b""
    finally:
        os.close(fd)


def read_at(fd: int, view: memoryview, offset: int) -> int:
    """Read into ``view`` from byte ``offset`` of ``fd``; the bytes read (short at the end).

    ``os.preadv`` fills the buffer in place and skips a buffered file object, which costs
    more than the read itself for small reads; ``os.pread`` is the fallback.
    """
    got = 0
    while got < len(view):  # a read may return less than asked (large reads)
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view[got:]], offset + got)
        else:
            chunk = os.pread(fd, len(view) - got, offset + got)
            n = len(chunk)
            view[got : got + n] = chunk
        if n == 0:
            break
        got += n
    return got


def temp_file(directory: Path, name: str) -> tuple[int, Path]:
    """A new, empty, hidden file beside ``directory/name``: (descriptor, path).

    The name is unpredictable and the file created exclusively without following links, so
    no file planted in the directory is ever opened for writing.
    """
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(name), suffix=TEMP_SUFFIX, dir=directory)
    return fd, Path(tmp)


def rename_new(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path`` atomically; FileExistsError if ``path`` exists.

    ``renameat2(RENAME_NOREPLACE)`` where the kernel has it, else a hard link (which never
    replaces either) and an unlink of ``tmp``.
    """
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(path), 1) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
        if code not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
            raise OSError(code, os.strerror(code), str(path))
    os.link(tmp, path)
    os.unlink(tmp)


def _load_renameat2() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        function = libc.renameat2
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p)
    function.argtypes += (ctypes.c_uint,)
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def write_json(path: Path, data: object, *, replace: bool) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a temporary file, then a rename).

    With ``replace=False`` an existing ``path`` raises FileExistsError.
    """
    write_bytes(path, json.dumps(data).encode(), replace=replace)


def write_bytes(path: Path, data: bytes, *, replace: bool) -> None:
    """Write ``data`` to ``path`` atomically, as :func:`write_json` does."""
    fd, tmp = temp_file(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if replace:
            os.replace(tmp, path)
        else:
            rename_new(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
