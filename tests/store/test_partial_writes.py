"""A file written by several short ``writev`` calls is whole (the kernel may write less)."""

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
        ("a", rng.normal(size=(3, 5)).astype(np.float32)),
        ("empty", np.zeros((0, 4), np.float32)),
        ("b", rng.integers(0, 9, size=(7,)).astype(np.int64)),
        ("c", rng.normal(size=(2, 3, 4)).astype(np.float16)),
    ]


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_short_writes_resume_where_they_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    calls = []

    def short_writev(fd: int, buffers: Sequence[memoryview]) -> int:
        # At most `chunk` bytes per call, and never past the first buffer: the worst case.
        calls.append(len(buffers))
        first = bytes(buffers[0])[:chunk]
        return os.write(fd, first)

    monkeypatch.setattr(safetensors_io.os, "writev", short_writev)
    monkeypatch.setattr(safetensors_io, "_IOV_MAX", 2)
    path = tmp_path / "x.safetensors"
    size = safetensors_io.write_file(path, _arrays(), {"k": "v"})
    assert path.stat().st_size == size and len(calls) > 1 and max(calls) <= 2
    loaded = load_file(str(path))
    for name, array in _arrays():
        np.testing.assert_array_equal(loaded[name], array)


def test_a_file_system_that_accepts_nothing_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(safetensors_io.os, "writev", lambda fd, buffers: 0)
    path = tmp_path / "x.safetensors"
    with pytest.raises(OSError, match="accepted no bytes"):
        safetensors_io.write_file(path, _arrays(), {})
    assert not list(tmp_path.iterdir())  # no partial file, no temporary left
