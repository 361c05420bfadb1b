"""Capturing beyond one process: torch.distributed, multi-process JAX, Ray Data, fsspec.

:func:`open_sink` is the store's ``open_sink`` aware of its surroundings: in a process of an
initialized torch.distributed group (or a multi-process JAX runtime) each process writes
its own part of the capture (:mod:`clouseau.distributed.parts`); a ``path`` that is an
fsspec URL (``s3://``, ``gs://``, ``file://``) is written locally and uploaded in the
background (:mod:`clouseau.distributed.remote`). Ray Data is
:func:`clouseau.distributed.ray.record` (``clouseau.ray.record``), whose actors write
blocks (:mod:`clouseau.distributed.blocks`). Frameworks are imported only when they are
already in use.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from clouseau.distributed.merged import PartedCapture
from clouseau.distributed.parts import (
    Group,
    IncompleteCaptureWarning,
    PartSink,
    RecordPart,
)
from clouseau.store import open_sink as _open_local_sink
from clouseau.store.directory_sink import DirectorySink
from clouseau.store.layout import DEFAULT_PATTERN
from clouseau.store.location import is_url
from clouseau.store.reader import register_opener
from clouseau.store.remote import TIMEOUT_S


def current_group() -> Group | None:
    """The process group this process writes in, or None when it runs alone."""
    from clouseau.distributed._torch import torch_group

    group = torch_group()
    if group is not None:
        return group
    from clouseau.distributed._jax import jax_group

    return jax_group()


def record_part(root: Path) -> RecordPart | None:
    """This rank's part of a ``clouseau.record`` run, or None when the process runs alone."""
    group = current_group()
    return None if group is None else RecordPart(root, group)


def adapt_to_engine(model: Any, fmodel: Any) -> None:
    """Fit an instrumented model to the engine running it (FSDP2's sharded weights)."""
    from clouseau.distributed._torch import gather_sharded_parameters

    gather_sharded_parameters(model, fmodel)


def open_sink(
    path: str | os.PathLike[str] | None,
    max_size_mb: float = 1024,
    filename_pattern: str = DEFAULT_PATTERN,
    *,
    group: Group | None = None,
    timeout_s: float = TIMEOUT_S,
) -> Any:
    """The sink an instrumented model writes to, wherever it runs and writes.

    Parameters
    ----------
    path
        A directory, an fsspec URL, or None (in memory; never split into parts).
    max_size_mb, filename_pattern
        As for :class:`clouseau.store.DirectorySink`.
    group
        The processes writing together; found by :func:`current_group` when None.
    timeout_s
        For a URL: the limit on each remote call (an upload, the lock), in seconds.

    Returns
    -------
    A sink: a DirectorySink or MemorySink alone, a PartSink per process, either behind an
    uploader for a URL.
    """
    if path is None:
        return _open_local_sink(None, max_size_mb, filename_pattern)
    group = group if group is not None else current_group()
    if not is_url(path):
        if group is None:
            return _open_local_sink(path, max_size_mb, filename_pattern)
        return PartSink(Path(path), group, max_size_mb, filename_pattern)
    from clouseau.distributed.remote import RemoteSink, filesystem, staging_directory

    url = str(path).rstrip("/")
    filesystem(url)  # a bad URL fails before anything is created
    local = staging_directory()
    try:
        inner = (
            DirectorySink(local, max_size_mb, filename_pattern)
            if group is None
            else PartSink(local, group, max_size_mb, filename_pattern)
        )
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        raise
    return RemoteSink(inner, local, url, group, timeout_s)


__all__ = [
    "Group",
    "IncompleteCaptureWarning",
    "PartSink",
    "PartedCapture",
    "adapt_to_engine",
    "current_group",
    "is_url",
    "open_sink",
    "record_part",
]


def _open(path: str | Path, strict: bool) -> PartedCapture | None:
    # clouseau.load of a URL or of a capture written in parts (torchrun ranks, Ray blocks).
    if isinstance(path, str) and "://" in path:
        from clouseau.distributed.remote import load_url  # fsspec only when asked for

        return load_url(path, strict=strict)  # type: ignore[return-value]
    from clouseau.distributed.part_load import load_parts
    from clouseau.distributed.parts import is_parted

    path = Path(path)
    return load_parts(path, strict=strict) if path.is_dir() and is_parted(path) else None


register_opener(_open)
