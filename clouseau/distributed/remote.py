"""fsspec destinations: a capture written locally, uploaded in the background.

The sink writes into a local staging directory as it always does (complete files renamed
into place); an uploader thread copies each complete file to the URL as soon as it
appears, so uploads overlap the forward passes. A file appears under its final remote name
only once complete: object stores (S3, GCS) publish an object when its upload ends; on
other file systems it is uploaded under a hidden temporary name and moved. The JSON files
that say a capture is whole (``status.json``, ``part.json``, ``manifest.json``) go last,
at close, so a reader never sees a closed capture whose files are still on their way.

Through the location layer (:mod:`clouseau.store.location`, :mod:`clouseau.store.remote`):
the URL is locked before anything is touched there; an earlier capture at the URL loses
only the files its ``status.json`` lists, and only once the new run has traced; a program
that ends without ``close()`` still uploads everything (or names the loss on stderr);
every remote call has a time limit, and a failure names what is at fault and the local
copy, which is kept.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from clouseau.distributed.parts import MANIFEST, PART_FILE, ForwardingSink, Group, part_name
from clouseau.ir.errors import CaptureError
from clouseau.ir.graph import Graph
from clouseau.store.capture import Capture
from clouseau.store.layout import STATUS_FILE
from clouseau.store.location import finalize
from clouseau.store.remote import (
    TIMEOUT_S,
    UrlLock,
    call,
    filesystem,
    is_atomic,
    remote_error,
    remote_previous_files,
)

T = TypeVar("T")
_LAST = (PART_FILE, STATUS_FILE, MANIFEST)  # uploaded at close, in this order

__all__ = [
    "RemoteSink",
    "Uploader",
    "filesystem",
    "load_url",
    "record_at_url",
    "staging_directory",
]


def staging_directory() -> Path:
    """A fresh local directory to write a capture into before it is uploaded."""
    return Path(tempfile.mkdtemp(prefix="clouseau-upload-"))


class Uploader:
    """Copies the complete files of ``local`` to ``url``; owns the URL's lock.

    It never holds the sink, so that a dropped sink is collected and finalized.
    """

    def __init__(
        self, local: Path, url: str, group: Group | None, timeout_s: float = TIMEOUT_S
    ) -> None:
        self.local, self.url, self.group, self.timeout_s = Path(local), url, group, timeout_s
        self.fs, self.root = filesystem(url)
        self._atomic = is_atomic(self.fs)
        self._uploaded: dict[str, tuple[int, int]] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._mutex = threading.Lock()  # the uploader thread and flush/close both sync
        self.cleared = False
        rank0 = group is None or group.rank == 0
        self.lock = UrlLock(self.fs, self.root, url, timeout_s) if rank0 else None
        try:
            self.previous = self._listed()
        except BaseException:
            self.release()
            raise
        self._thread = threading.Thread(target=self._loop, name="clouseau-upload", daemon=True)
        self._thread.start()

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _listed(self) -> list[str]:
        """The files of the earlier capture at the URL this process may replace, by the
        names its status (or its part's) lists; rank 0 also the manifest."""
        if self.group is None:
            return remote_previous_files(self.fs, self.root, self.url, self.timeout_s)
        part = part_name(self.group.rank)
        names = [
            f"{part}/{n}"
            for n in remote_previous_files(self.fs, f"{self.root}/{part}", self.url, self.timeout_s)
        ]
        return names + [f"{part}/{PART_FILE}"] + ([MANIFEST] if self.group.rank == 0 else [])

    def clear(self) -> None:
        """The new run has traced: remove the earlier capture's listed files."""
        with self._mutex:  # no upload runs while the earlier files go
            if self.cleared:
                return
            for name in self.previous:
                target = f"{self.root}/{name}"
                self._remote(f"removing {name} from", lambda t=target: _rm(self.fs, t))
            self.cleared = True

    def _remote(self, doing: str, function: Any) -> Any:
        try:
            return call(f"{doing} {self.url}", function, self.timeout_s)
        except CaptureError:
            raise
        except Exception as err:
            raise remote_error(err, self.url, doing, self.local) from None

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.sync(final=False)
            except BaseException as err:  # reported at the next call, and at close
                self.error = err
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s)

    def sync(self, final: bool) -> None:
        with self._mutex:
            self._sync_locked(final)

    def _sync_locked(self, final: bool) -> None:
        if self.error is not None:
            self.raise_error()
        if not self.cleared:
            return  # nothing is written before the run has traced
        pending = []
        for file in sorted(self.local.rglob("*")):
            if not file.is_file() or file.is_symlink() or file.name.startswith("."):
                continue
            if file.name in _LAST and not final:
                continue
            stat = file.stat()
            rel = file.relative_to(self.local).as_posix()
            if self._uploaded.get(rel) != (stat.st_size, stat.st_mtime_ns):
                pending.append((rel, file, (stat.st_size, stat.st_mtime_ns)))
        pending.sort(key=lambda p: _LAST.index(p[1].name) + 1 if p[1].name in _LAST else 0)
        for rel, file, stamp in pending:
            self._put(file, f"{self.root}/{rel}")
            self._uploaded[rel] = stamp

    def _put(self, file: Path, target: str) -> None:
        def put() -> None:
            if self._atomic:
                self.fs.put_file(str(file), target)
                return
            parent, name = target.rsplit("/", 1)
            # Unpredictable, so no link planted at the URL is written through.
            tmp = f"{parent}/.{name}.{uuid.uuid4().hex[:8]}.upload.tmp"
            self.fs.makedirs(parent, exist_ok=True)
            self.fs.put_file(str(file), tmp)
            self.fs.mv(tmp, target)

        self._remote(f"uploading {file.name} to", put)

    def raise_error(self) -> None:
        if self.error is None:
            return
        if isinstance(self.error, CaptureError):
            raise CaptureError(str(self.error)) from self.error
        raise remote_error(self.error, self.url, "uploading to", self.local) from self.error


def _rm(fs: Any, target: str) -> None:
    if fs.exists(target):
        fs.rm(target)


class RemoteSink(ForwardingSink):
    """A sink writing to ``local`` whose complete files are uploaded to ``url``.

    Parameters
    ----------
    inner
        The local sink (a DirectorySink or a PartSink) writing into ``local``.
    local
        Its directory; removed once everything is uploaded (kept, and named, if not).
    url
        The destination; the files an earlier capture there lists are replaced.
    group
        The processes writing together: each uploads its own part, rank 0 the manifest.
    timeout_s
        The limit on each remote call (an upload of one file, the lock): an endpoint
        that stops answering is a CaptureError after this long, never a hang.
    """

    def __init__(
        self, inner: Any, local: Path, url: str, group: Group | None, timeout_s: float = TIMEOUT_S
    ) -> None:
        self.inner, self.local, self.url = inner, Path(local), url
        try:
            self.uploader = Uploader(local, url, group, timeout_s)
        except BaseException:
            _abandon(inner, self.local)
            raise
        self._closed = False
        if hasattr(inner, "publish"):
            # A part is uploaded whole before the processes gather, and the manifest after.
            uploader = self.uploader
            inner.publish = lambda: uploader.sync(final=True)
        # Dropped, or the program ends without close(): everything is still uploaded.
        self._finalizer = finalize(self, _closer(inner, self.uploader, self.local), url)

    # -- the Sink protocol: the inner sink's, plus the uploads --------------------------
    def add_graph(self, graph: Graph) -> int:
        graph_id = self.inner.add_graph(graph)
        self.uploader.clear()  # traced: the earlier capture at the URL goes now
        return graph_id

    def begin_call(self) -> int:
        self.uploader.raise_error()
        call_index = self.inner.begin_call()
        self.uploader.clear()
        return call_index

    def flush(self) -> None:
        self.inner.flush()
        self.uploader.sync(final=False)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _closer(self.inner, self.uploader, self.local)()

    def abandon(self) -> None:
        """Give up before anything was written (a failed ``instrument``): no upload, the
        staging directory and the lock released."""
        self._closed = True
        self._finalizer.detach()
        self.uploader.stop()
        self.uploader.release()
        _abandon(self.inner, self.local)

    def capture(self) -> Capture:
        if self._closed:
            return load_url(self.url)
        return self.inner.capture()


def _abandon(inner: Any, local: Path) -> None:
    if hasattr(inner, "abandon"):
        inner.abandon()
    else:
        inner.close()
    shutil.rmtree(local, ignore_errors=True)


def _closer(inner: Any, uploader: Uploader, local: Path) -> Any:
    def close() -> None:
        try:
            inner.close()
        finally:
            uploader.stop()
        try:
            # Traced, or nothing was there: upload. Failed before it traced: the
            # earlier capture at the URL stays as it was.
            if uploader.cleared or not uploader.previous:
                uploader.clear()
                uploader.sync(final=True)
        except BaseException:
            uploader.release()
            raise  # the staging directory stays: the message names it
        uploader.release()
        shutil.rmtree(local, ignore_errors=True)

    return close


def load_url(url: str, strict: bool = False) -> Capture:
    """``clouseau.load`` of an fsspec URL: the capture is downloaded to a local cache first."""
    from clouseau.store.reader import load

    fs, root = filesystem(url)
    if not fs.exists(root):
        raise CaptureError(f"{url} does not exist; pass the path given to clouseau.instrument")
    local = Path(tempfile.mkdtemp(prefix="clouseau-download-"))
    fs.get(f"{root}/", f"{local}/", recursive=True)
    capture = load(local, strict=strict)
    weakref.finalize(capture, shutil.rmtree, local, True)
    return capture


def record_at_url(
    url: str, run: Callable[[Path], T], resume: bool, timeout_s: float = TIMEOUT_S
) -> T:
    """``run(local)`` records into a local staging directory; its files go to ``url``.

    ``clouseau.record`` and ``clouseau.ray.record`` to a URL: the URL is locked first; with
    ``resume`` what is at the URL is downloaded to continue it. The recording is uploaded
    when ``run`` ends, also when it fails once it has started (so that ``resume=True``
    continues it); the earlier capture's listed files go only then. A failed upload names
    the local copy, which is kept.
    """
    local = staging_directory()
    try:
        uploader = Uploader(local, url, None, timeout_s)
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        raise
    try:
        if resume and uploader.previous:
            root = uploader.root
            uploader._remote(
                "downloading", lambda: uploader.fs.get(f"{root}/", f"{local}/", recursive=True)
            )
        try:
            result = run(local)
        except BaseException:
            if any(local.iterdir()) and uploader.error is None:
                with contextlib.suppress(CaptureError):
                    _upload_all(uploader)
            raise
        _upload_all(uploader)
    except BaseException:
        uploader.stop()
        uploader.release()
        raise
    uploader.stop()
    uploader.release()
    # The local copy serves the capture returned (its arrays are read lazily) until the
    # capture is dropped.
    weakref.finalize(result, shutil.rmtree, local, True)
    return result


def _upload_all(uploader: Uploader) -> None:
    uploader.clear()
    uploader.sync(final=True)
