"""Every write call of a file is bounded by ``WRITE_CHUNK``, and the file is byte-identical.

Some kernels write one buffer of 2 MiB or more many times slower than the same bytes in
1 MiB writes, so the writer never hands the kernel more than ``WRITE_CHUNK`` bytes at once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from clouseau.store import safetensors_io


def _arrays() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        ("big", rng.normal(size=(3 * 2**18 + 5,)).astype(np.float32)),  # 3 MiB and a bit
        ("small", rng.normal(size=(3, 5)).astype(np.float16)),
        ("empty", np.zeros((0, 4), np.float32)),
        ("mid", rng.integers(0, 9, size=(2**17,)).astype(np.int64)),  # exactly 1 MiB
        ("tail", rng.normal(size=(7,)).astype(np.float64)),
    ]


def test_writes_are_bounded_and_the_file_is_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    real_writev = os.writev

    def counting_writev(fd: int, buffers: Sequence[memoryview]) -> int:
        sizes.append(sum(len(b) for b in buffers))
        return real_writev(fd, buffers)

    monkeypatch.setattr(safetensors_io.os, "writev", counting_writev)
    ours = tmp_path / "ours.safetensors"
    total = safetensors_io.write_file(ours, _arrays(), {"k": "v"})
    assert sum(sizes) == total == ours.stat().st_size
    assert max(sizes) <= safetensors_io.WRITE_CHUNK
    # Small buffers share a call, large ones are cut: as few calls as the bound allows.
    assert len(sizes) == -(-total // safetensors_io.WRITE_CHUNK)
    # The same file in one unbounded writev, as the writer did before the bound.
    monkeypatch.setattr(safetensors_io, "WRITE_CHUNK", 2**40)
    whole = tmp_path / "whole.safetensors"
    safetensors_io.write_file(whole, _arrays(), {"k": "v"})
    assert ours.read_bytes() == whole.read_bytes()
    loaded = load_file(str(ours))
    for name, array in _arrays():
        np.testing.assert_array_equal(loaded[name], array)


@pytest.mark.parametrize("chunk", [1, 4096, 2**20])
def test_pieces_cover_the_buffers_in_order(chunk: int) -> None:
    buffers = [b"header", memoryview(np.arange(3 * 2**18, dtype=np.uint8)), b"", b"x"]
    pieces = safetensors_io._pieces(buffers, chunk)
    assert all(0 < len(p) <= chunk for p in pieces)
    ends = np.cumsum([len(p) for p in pieces])
    starts = ends - [len(p) for p in pieces]
    assert all(s // chunk == (e - 1) // chunk for s, e in zip(starts, ends, strict=True))
    assert b"".join(bytes(p) for p in pieces) == b"".join(bytes(b) for b in buffers)
