"""When the processes of a capture written in parts may touch the capture path.

Before anything is created: rank 0 locks the whole capture, every rank learns whether it
could (a collective), then each rank locks its part and all learn whether every rank
could. A second run on the path of a running one is thus refused on every rank before any
of them has created a part or rewritten the manifest. Only once a rank has traced does it
write its ``part.json``, and rank 0 the manifest (marked incomplete) and the removal of the
parts of an earlier run with more processes: their own files only, by the names their
status lists (:mod:`clouseau.store.location`), and the directory only if nothing else is
left in it. A run that fails before it traces leaves the earlier capture as it was.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from clouseau.ir.errors import CaptureError
from clouseau.store.files import write_json
from clouseau.store.layout import LOCK_FILE
from clouseau.store.location import escaped, previous_files, remove_empty
from clouseau.store.lock import DirectoryLock

if TYPE_CHECKING:
    from clouseau.distributed.parts import Group

T = TypeVar("T")
_RANK = re.compile(r"rank-(\d{5})")


class SameBatchesWarning(UserWarning):
    """Every rank of a torchrun recording recorded the same batches."""


def lock_root(root: Path, group: Group) -> DirectoryLock | None:
    """Rank 0's lock of the whole capture (None on the other ranks), taken before any rank
    touches anything; a refusal on rank 0 is raised on every rank."""
    if root.exists() and not root.is_dir():
        raise CaptureError(f"the capture path {escaped(root)} is a file; pass a directory")
    return together(group, lambda: _lock_dir(root) if group.rank == 0 else None)


def together(group: Group, step: Callable[[], T]) -> T:
    """Run ``step`` on every rank, then raise on every rank if it failed on any."""
    result: T | None = None
    failure: str | None = None
    try:
        result = step()
    except CaptureError as err:
        failure = str(err)
    try:
        outcomes = group.gather(failure)
    except Exception as err:  # the group is gone: nothing more can be agreed on
        _undo(result)
        raise CaptureError(
            f"the processes of {group.engine} could not agree on who writes the capture "
            f"({type(err).__name__}: {err}); check that every rank runs the same code"
        ) from err
    failed = [(rank, why) for rank, why in enumerate(outcomes) if isinstance(why, str)]
    if failed:
        _undo(result)
        rank, why = failed[0]
        raise CaptureError(f"rank {rank} of {group.world_size}: {why}")
    return result  # type: ignore[return-value]


def _undo(result: object) -> None:
    """Give up what a step took (a sink that wrote nothing, a lock)."""
    if hasattr(result, "abandon"):
        result.abandon()
    elif isinstance(result, DirectoryLock):
        result.release()


def _lock_dir(directory: Path) -> DirectoryLock:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CaptureError(
            f"cannot create {escaped(directory)}: {err.strerror or err}; pass a writable path"
        ) from None
    return DirectoryLock(directory)


def lock_part(part: Path) -> DirectoryLock:
    return _lock_dir(part)


def begin_parts(root: Path, group: Group, part: Path, about: Mapping[str, Any]) -> None:
    """This rank has traced: its ``part.json``; on rank 0 also the manifest (incomplete)
    and the removal of an earlier run's parts beyond this run's processes."""
    from clouseau.distributed.parts import FORMAT, PART_FILE, write_manifest

    who = {"format": FORMAT, "engine": group.engine, "rank": group.rank}
    write_json(part / PART_FILE, {**who, "world_size": group.world_size, **about}, replace=True)
    if group.rank != 0:
        return
    write_manifest(root, group, None)
    for child in sorted(root.iterdir()):
        match = _RANK.fullmatch(child.name)
        if not match or int(match.group(1)) < group.world_size or child.is_symlink():
            continue
        if child.is_dir():
            remove_stale_part(child)


def remove_stale_part(part: Path) -> None:
    """Remove a part of an earlier run: its own files by name, then the directory if empty
    (a user's file inside keeps it, and ``load`` then names it as a stray part)."""
    from clouseau.distributed.parts import PART_FILE
    from clouseau.distributed.shards import SHARDS_FILE

    lock = DirectoryLock(part)  # its writer is gone (we hold the root): never raced
    try:
        names = set(previous_files(part)) | {PART_FILE, SHARDS_FILE}
    finally:
        lock.release()
    remove_empty(part, {*names, LOCK_FILE})


def batches_digest(part: Path) -> str | None:
    """A digest of the batches a recording part holds (their input digests), or None."""
    from clouseau.store.progress import read_progress

    try:
        progress = read_progress(part)
    except CaptureError:
        return None
    if progress is None or not progress.batches:
        return None
    h = hashlib.blake2b(digest_size=12)
    for batch in progress.batches:
        h.update(batch.digest.encode())
    return h.hexdigest()


def warn_if_same_batches(part: Path, group: Group, summaries: Sequence[object]) -> None:
    """Warn once (rank 0) when every rank recorded the same batches: each was given the
    whole data instead of its share."""
    digests = [s.get("batches") if isinstance(s, dict) else None for s in summaries]
    if group.world_size < 2 or digests[0] is None or len(set(digests)) != 1:
        return
    warnings.warn(
        f"clouseau.record: all {group.world_size} ranks recorded the same batches into "
        f"{escaped(part.parent)} (each was given the whole data): pass each rank its share, "
        "e.g. data[rank::world_size] (rank = torch.distributed.get_rank()) or a DataLoader "
        "with a DistributedSampler",
        SameBatchesWarning,
        stacklevel=4,
    )
