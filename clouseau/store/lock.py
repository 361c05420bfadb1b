"""The writer's lock on a capture directory: one writer at a time, named when refused.

An exclusive ``flock`` on ``.clouseau.lock`` in the directory, held from the moment an
instrumented model opens the directory until it is closed (or dropped, or the process
ends: the kernel releases a dead process's lock, so a ``kill -9`` never leaves a stale
lock behind). The file holds who took the lock (pid, host, time) so that a refused writer
can say who holds it. The file itself stays: removing it would let a third writer lock a
new file while the second still holds the old one.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import socket
import stat
import time
from pathlib import Path

from clouseau.ir.errors import CaptureError
from clouseau.store.layout import LOCK_FILE, escaped

try:
    import fcntl
except ImportError:  # Windows: no flock; the directory is not locked there
    fcntl = None  # type: ignore[assignment]


class DirectoryLock:
    """An exclusive lock on ``directory``, taken at construction; ``release()`` drops it."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self.fd = _open(self.path)
        try:
            self._acquire()
        except BaseException:
            os.close(self.fd)
            raise
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(owner).encode(), 0)

    def _acquire(self) -> None:
        if fcntl is None:
            return
        for attempt in range(2):
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                holder = _holder(self.fd)
                if attempt == 0 and holder.get("pid") == os.getpid():
                    # Held in this process, maybe by a dropped model that only the cycle
                    # collector will finalize: collect, then try once more.
                    gc.collect()
                    continue
                raise CaptureError(_refusal(self.path.parent, holder)) from None

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = -1


def _open(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as err:
        why = (
            "it is a symbolic link (not followed): remove it"
            if err.errno == errno.ELOOP
            else err.strerror or str(err)
        )
        raise CaptureError(
            f"cannot lock the capture directory with {escaped(path)}: {why}"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CaptureError(
            f"cannot lock the capture directory: {escaped(path)} is not a regular file"
        )
    return fd


def _holder(fd: int) -> dict[str, object]:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _refusal(directory: Path, holder: dict[str, object]) -> str:
    pid, host, since = holder.get("pid"), holder.get("host"), holder.get("since")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
        if isinstance(since, int | float)
        else "an unknown time"
    )
    if pid == os.getpid() and host == socket.gethostname():
        who = (
            f"another instrumented model of this process (pid {pid}), open since {when}: "
            "close it first (fmodel.close() or a with block), or give this one another path"
        )
    else:
        who = (
            f"process {pid} on host {host}, since {when}: wait for it to finish, or give "
            "this model another path"
        )
    return f"the capture directory {escaped(directory)} is being written by {who}"
