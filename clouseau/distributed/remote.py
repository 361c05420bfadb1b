"""fsspec destinations: a capture written locally, uploaded in the background.

The sink writes into a local staging directory as it always does (complete files renamed
into place); an uploader thread copies each complete file to the URL as soon as it
appears, so uploads overlap the forward passes. A file appears under its final remote name
only once complete: object stores (S3, GCS) publish an object when its upload ends; on
other file systems it is uploaded under a hidden temporary name and moved. The JSON files
that say a capture is whole (``status.json``, ``part.json``, ``manifest.json``) go last,
at close, so a reader never sees a closed capture whose files are still on their way.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

from clouseau.distributed.parts import MANIFEST, PART_FILE, ForwardingSink, Group, part_name
from clouseau.ir.errors import CaptureError, MissingExtraError
from clouseau.store.capture import Capture
from clouseau.store.layout import STATUS_FILE

_LAST = (PART_FILE, STATUS_FILE, MANIFEST)  # uploaded at close, in this order
_ATOMIC_PUT = {"s3", "s3a", "gs", "gcs", "az", "abfs", "memory"}


def staging_directory() -> Path:
    """A fresh local directory to write a capture into before it is uploaded."""
    return Path(tempfile.mkdtemp(prefix="clouseau-upload-"))


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
            f"cannot use {url}: {err}; pass a local path or an fsspec URL whose file system "
            "is installed (s3:// needs pip install 'clouseau[s3]')"
        ) from None
    return fs, root.rstrip("/")


class RemoteSink(ForwardingSink):
    """A sink writing to ``local`` whose complete files are uploaded to ``url``.

    Parameters
    ----------
    inner
        The local sink (a DirectorySink or a PartSink) writing into ``local``.
    local
        Its directory; removed once everything is uploaded.
    url
        The destination; clouseau's files of an earlier capture there are replaced.
    group
        The processes writing together: each uploads its own part, rank 0 the manifest.
    """

    def __init__(self, inner: Any, local: Path, url: str, group: Group | None) -> None:
        self.inner, self.local, self.url = inner, Path(local), url
        self.fs, self.root = filesystem(url)
        self._atomic = bool(set(_protocols(self.fs)) & _ATOMIC_PUT)
        self._uploaded: dict[str, tuple[int, int]] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the uploader thread and flush/close both sync
        self._clear_remote(group)
        if hasattr(inner, "publish"):
            # A part is uploaded whole before the processes gather, and the manifest after.
            inner.publish = lambda: self._sync(final=True)
        self._thread = threading.Thread(
            target=self._loop, name=f"clouseau-upload:{url}", daemon=True
        )
        self._thread.start()
        self._closed = False

    # -- the Sink protocol: the inner sink's, plus the uploads --------------------------
    def begin_call(self) -> int:
        self._raise_upload_error()
        return self.inner.begin_call()

    def flush(self) -> None:
        self.inner.flush()
        self._sync(final=False)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.inner.close()
        finally:
            self._stop.set()
            self._thread.join()
        self._sync(final=True)
        shutil.rmtree(self.local, ignore_errors=True)

    def capture(self) -> Capture:
        if self._closed:
            return load_url(self.url)
        return self.inner.capture()

    # -- uploads ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._sync(final=False)
            except BaseException as err:  # reported at the next call, and at close
                self._error = err
                return

    def _sync(self, final: bool) -> None:
        with self._lock:
            self._sync_locked(final)

    def _sync_locked(self, final: bool) -> None:
        if self._error is not None:
            self._raise_upload_error()
        pending = []
        for file in sorted(self.local.rglob("*")):
            if not file.is_file() or file.name.startswith("."):
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
        try:
            if self._atomic:
                self.fs.put_file(str(file), target)
            else:
                parent, name = target.rsplit("/", 1)
                tmp = f"{parent}/.{name}.upload.tmp"
                self.fs.makedirs(parent, exist_ok=True)
                self.fs.put_file(str(file), tmp)
                self.fs.mv(tmp, target)
        except OSError as err:
            raise CaptureError(f"uploading {file.name} to {self.url} failed: {err}") from err

    def _raise_upload_error(self) -> None:
        if self._error is not None:
            raise CaptureError(
                f"uploading the capture to {self.url} failed: {self._error}; the files "
                f"uploaded before are complete"
            ) from self._error

    def _clear_remote(self, group: Group | None) -> None:
        # An earlier capture at the URL: this process's part of it (rank 0 also the
        # manifest and parts beyond this run's processes), or the whole plain capture.
        if not self.fs.exists(self.root):
            return
        if group is None:
            targets = [STATUS_FILE, "graph-*.json", "*.safetensors"]
        else:
            targets = [part_name(group.rank)]
            if group.rank == 0:
                targets += [MANIFEST, "rank-*"]
        for pattern in targets:
            for found in self.fs.glob(f"{self.root}/{pattern}"):
                name = found.rstrip("/").rsplit("/", 1)[-1]
                if group is not None and _other_live_part(name, group):
                    continue  # another rank's, cleared by that rank
                self.fs.rm(found, recursive=True)


def _other_live_part(name: str, group: Group) -> bool:
    if not name.startswith("rank-") or name == part_name(group.rank):
        return False
    return name[5:].isdigit() and int(name[5:]) < group.world_size


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


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
