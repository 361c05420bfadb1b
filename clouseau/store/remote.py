"""fsspec URLs in the location layer: bounded remote calls, their errors, the URL's lock.

Every call to the remote file system runs in a daemon thread of its own with a time limit
(:func:`call`), so an endpoint that stops answering is a :class:`CaptureError` after
``timeout_s`` (default :data:`TIMEOUT_S`), never a hang, and the program can still exit.
Its errors name what is at fault (the credentials, the endpoint or the bucket) and where
the local copy of the capture is (:func:`remote_error`).

The lock of a URL is an object at the URL, ``.clouseau.lock``, holding the owner (a random
token), host, pid and time, refreshed by the writer every :data:`HEARTBEAT_S`: a second
writer is refused naming the first, unless the lock is stale (its process is gone on this
host, or it was not refreshed for :data:`STALE_S`). An object store has no atomic create,
so a writer reads the lock back after writing it: of two that race, the one whose token is
not there backs off.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from clouseau.ir.errors import CaptureError, MissingExtraError
from clouseau.store.files import MAX_JSON_BYTES
from clouseau.store.layout import LOCK_FILE, STATUS_FILE
from clouseau.store.location import escaped

T = TypeVar("T")
#: The default limit, in seconds, on one remote call (an upload of one file included).
TIMEOUT_S = 300.0
HEARTBEAT_S = 30.0
STALE_S = 300.0
_ATOMIC_PUT = {"s3", "s3a", "gs", "gcs", "az", "abfs", "memory"}


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path in it; CaptureError naming the fix."""
    try:
        import fsspec
    except ImportError:
        raise MissingExtraError("fsspec", "fsspec") from None
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:  # s3fs, gcsfs: fsspec names the package
        raise CaptureError(
            f"cannot use {escaped(url)}: {err}; pass a local path or an fsspec URL whose file "
            "system is installed (s3:// needs pip install 'clouseau[s3]')"
        ) from None
    return fs, root.rstrip("/")


def is_atomic(fs: Any) -> bool:
    """Whether an object appears only once its upload is whole (object stores)."""
    protocol = fs.protocol
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return bool(set(protocols) & _ATOMIC_PUT)


def call(what: str, function: Callable[[], T], timeout_s: float) -> T:
    """``function()`` in a daemon thread, at most ``timeout_s`` seconds (TimeoutError)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = function()
        except BaseException as err:  # handed to the caller
            box["error"] = err

    thread = threading.Thread(target=run, name=f"clouseau-remote:{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} got no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def remote_error(err: BaseException, url: str, doing: str, local: Path | None) -> CaptureError:
    """A CaptureError for a failed remote call: the cause, what is at fault and the fix."""
    text = f"{type(err).__name__}: {err}"
    lowered = text.lower()
    bucket = url.split("://", 1)[-1].split("/", 1)[0]
    if any(k in lowered for k in ("nosuchbucket", "bucket does not exist", "no such bucket")):
        fault = f"the bucket {bucket!r} does not exist: create it, or fix the URL"
    elif isinstance(err, PermissionError) or any(
        k in lowered
        for k in ("forbidden", "accessdenied", "access denied", "invalidaccesskeyid",
                  "signaturedoesnotmatch", "credentials", "403")
    ):  # fmt: skip
        fault = (
            f"the credentials were refused for {bucket!r}: check AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY (or the profile, or the bucket's policy) allow writing there"
        )
    elif isinstance(err, TimeoutError | ConnectionError) or any(
        k in lowered for k in ("timeout", "timed out", "connect", "endpoint", "unreachable")
    ):
        fault = (
            "the endpoint does not answer: check the endpoint_url (fsspec.config.conf or "
            "AWS_ENDPOINT_URL) and the network"
        )
    else:
        fault = "see the cause above"
    kept = (
        f"; the whole capture is still on local disk in {escaped(local)}"
        if local is not None
        else ""
    )
    return CaptureError(f"{doing} {escaped(url)} failed ({text}): {fault}{kept}")


class UrlLock:
    """The lock of the capture at ``root`` on ``fs``; see the module docstring."""

    def __init__(self, fs: Any, root: str, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.fs, self.path, self.url, self.timeout_s = fs, f"{root}/{LOCK_FILE}", url, timeout_s
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        holder = self._read()
        if holder is not None and not _stale(holder):
            raise CaptureError(_refusal(url, holder))
        self._write()
        time.sleep(0.05)  # a racing writer's object lands first, or after this read
        holder = self._read()
        if holder is None or holder.get("token") != self.token:
            raise CaptureError(_refusal(url, holder or {}))
        self._thread = threading.Thread(target=self._beat, name="clouseau-lock", daemon=True)
        self._thread.start()

    def _owner(self) -> dict[str, object]:
        return {"token": self.token, "pid": os.getpid(), "host": socket.gethostname(),
                "since": time.time()}  # fmt: skip

    def _write(self) -> None:
        data = json.dumps(self._owner()).encode()

        def write() -> None:
            if not is_atomic(self.fs):  # a file system with directories: create it first
                self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(self.path, data)

        try:
            call("writing the lock", write, self.timeout_s)
        except Exception as err:
            raise remote_error(err, self.url, "locking", None) from None

    def _read(self) -> dict[str, Any] | None:
        def read() -> bytes | None:
            if not self.fs.exists(self.path):
                return None
            if self.fs.size(self.path) > 4096:
                return b"{}"
            return self.fs.cat_file(self.path)

        try:
            raw = call("reading the lock", read, self.timeout_s)
        except Exception as err:
            raise remote_error(err, self.url, "locking", None) from None
        if raw is None:
            return None
        try:
            holder = json.loads(raw)
        except ValueError:
            return {}
        return holder if isinstance(holder, dict) else {}

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            # A failed beat: the next one tries again; a lock left unrefreshed goes stale.
            with contextlib.suppress(CaptureError):
                self._write()

    def release(self) -> None:
        """Remove the lock object if it is still this writer's (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            holder = self._read()
            if holder is not None and holder.get("token") == self.token:
                call("removing the lock", lambda: self.fs.rm_file(self.path), self.timeout_s)
        except Exception:  # a lock left behind goes stale; it never blocks forever
            pass


def _stale(holder: dict[str, Any]) -> bool:
    since = holder.get("since")
    if not isinstance(since, int | float) or time.time() - since > STALE_S:
        return True
    pid = holder.get("pid")
    if holder.get("host") == socket.gethostname() and isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


def _refusal(url: str, holder: dict[str, Any]) -> str:
    since = holder.get("since")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
        if isinstance(since, int | float)
        else "an unknown time"
    )
    return (
        f"the capture at {escaped(url)} is being written by process {holder.get('pid')} on "
        f"host {holder.get('host')}, since {when} (its lock {LOCK_FILE} is refreshed every "
        f"{HEARTBEAT_S:g} s and stale after {STALE_S:g} s): wait for it to finish, or give "
        "this run another URL"
    )


def read_remote_json(fs: Any, path: str, url: str, timeout_s: float) -> Any:
    """A small JSON object at ``path`` (at most the store's JSON limit), or None."""

    def read() -> bytes | None:
        if not fs.exists(path):
            return None
        if fs.size(path) > MAX_JSON_BYTES:
            raise CaptureError(f"{escaped(path)} is larger than any file clouseau writes")
        return fs.cat_file(path)

    try:
        raw = call(f"reading {path}", read, timeout_s)
    except CaptureError:
        raise
    except Exception as err:
        raise remote_error(err, url, "reading", None) from None
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def remote_previous_files(fs: Any, root: str, url: str, timeout_s: float) -> list[str]:
    """The files of an earlier capture at ``root`` as its ``status.json`` lists them."""
    from clouseau.store.layout import FORMAT, graph_file

    status = read_remote_json(fs, f"{root}/{STATUS_FILE}", url, timeout_s)
    if not isinstance(status, dict) or status.get("format") != FORMAT:
        return []
    names = [STATUS_FILE]
    files = status.get("files")
    names += [
        n for n in (files if isinstance(files, list) else [])
        if isinstance(n, str) and n and "/" not in n and not n.startswith(".")
    ]  # fmt: skip
    graphs = status.get("graphs")
    if type(graphs) is int and 0 <= graphs < 10**6:
        names += [graph_file(i) for i in range(graphs)]
    return names
