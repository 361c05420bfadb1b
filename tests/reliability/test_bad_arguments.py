"""Bad ``instrument``/``load`` arguments through the public API, with either framework.

The store's own tests (tests/store) cover these at the sink; here they go through
``clouseau.instrument`` with a real model, so nothing of the model runs or is kept.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

import clouseau
from clouseau.ir.errors import CaptureError
from tests.reliability.jax_models import mlp
from tests.reliability.models import Small


@pytest.fixture(params=["torch", "jax"])
def model(request: pytest.FixtureRequest) -> Any:
    return Small() if request.param == "torch" else mlp


def test_path_that_is_a_file(model: Any, tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("mine")
    with pytest.raises(CaptureError) as info:
        clouseau.instrument(model, path=file)
    assert str(info.value) == (
        f"the capture path {file} is a file; pass a directory (it is created if missing)"
    )
    assert file.read_text() == "mine"


def test_path_that_cannot_be_written(model: Any, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(CaptureError) as info:
        clouseau.instrument(model, path=tmp_path / "f" / "sub")
    text = str(info.value)
    assert text.startswith(f"cannot write to the capture path {tmp_path / 'f' / 'sub'}")
    assert "pass a writable directory" in text


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_directory(model: Any, tmp_path: Path) -> None:  # pragma: no cover - root CI
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(CaptureError, match="pass a writable directory"):
            clouseau.instrument(model, path=tmp_path / "cap")
    finally:
        tmp_path.chmod(0o700)


@pytest.mark.parametrize("size", [0, -1, math.nan, -math.inf])
def test_max_size_mb_not_positive(model: Any, size: float, tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        clouseau.instrument(model, path=tmp_path, max_size_mb=size)
    assert "max_size_mb must be a positive number of megabytes (e.g. 1024" in str(info.value)


@pytest.mark.parametrize("size", ["100", None, True, [1]])
@pytest.mark.parametrize("in_memory", [False, True])
def test_max_size_mb_not_a_number(model: Any, size: Any, in_memory: bool, tmp_path: Path) -> None:
    with pytest.raises(TypeError) as info:
        clouseau.instrument(model, path=None if in_memory else tmp_path, max_size_mb=size)
    assert "max_size_mb must be a positive number of megabytes" in str(info.value)
    assert repr(size) in str(info.value)


@pytest.mark.parametrize("in_memory", [False, True])
def test_filename_pattern_without_idx(model: Any, in_memory: bool, tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        clouseau.instrument(
            model, path=None if in_memory else tmp_path, filename_pattern="acts.safetensors"
        )
    text = str(info.value)
    assert "filename_pattern 'acts.safetensors' has no {idx} field" in text
    assert "every rolled file would overwrite the last" in text
    assert "use e.g. 'activations-{idx:03d}.safetensors'" in text


def test_load_a_directory_that_is_not_a_capture(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CaptureError) as info:
        clouseau.load(tmp_path)
    text = str(info.value)
    assert f"{tmp_path} is not a clouseau capture" in text
    assert "Point load() at the directory given to clouseau.instrument(path=...)" in text


def test_load_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="does not exist; pass the directory given to"):
        clouseau.load(tmp_path / "nothing")


def test_instrument_something_that_is_not_a_model() -> None:
    with pytest.raises(TypeError) as info:
        clouseau.instrument(42, path=None)
    assert "clouseau cannot trace a int: pass a torch.nn.Module, a JAX function" in str(info.value)
