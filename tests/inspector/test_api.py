"""The framework-free parts of the seed API: model checks, reading files back, magnify."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from clouseau import inspector
from clouseau.inspector import _view, capture_directory, is_jax_model, is_torch_model


def test_importing_the_inspector_imports_no_framework() -> None:
    code = (
        "import sys, clouseau.inspector as i; "
        "assert not {'torch', 'jax', 'equinox', 'treescope'} & set(sys.modules), sorted(sys.modules); "
        "assert not i.is_jax_model(3) and not i.is_torch_model(3); "
        "assert not {'torch', 'jax'} & set(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_is_jax_model_is_the_seeds() -> None:
    jax = pytest.importorskip("jax")
    eqx = pytest.importorskip("equinox")
    jnp = jax.numpy
    assert not is_jax_model(3)
    assert not is_jax_model("model")
    assert not is_jax_model(jnp.ones(3))  # a raw array is a bare leaf
    assert not is_jax_model([1, 2.0])  # a container, but no jax.Array leaf
    assert not is_jax_model(eqx.nn.Lambda(jax.nn.relu))  # no parameters to record
    assert is_jax_model({"w": jnp.ones(2)})

    class Scale(eqx.Module):
        weight: jax.Array

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.weight * x

    assert is_jax_model(Scale(jnp.ones(2)))
    assert not is_jax_model(object())


def test_is_torch_model_is_the_seeds() -> None:
    torch = pytest.importorskip("torch")
    assert is_torch_model(torch.nn.Linear(2, 3))
    assert not is_torch_model(torch.ones(3))
    assert not is_torch_model(3)


def test_a_safetensors_path_names_a_capture_directory() -> None:
    assert capture_directory("run") == Path("run")
    assert capture_directory(".clouseau/trace-torch.safetensors") == Path(".clouseau/trace-torch")
    assert Path(".clouseau") == inspector.DEFAULT_PATH


def _write(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    from clouseau.store.safetensors_io import write_file

    write_file(path, list(arrays.items()), metadata)


def test_files_of_the_original_clouseau_read_in_their_recorded_order(tmp_path: Path) -> None:
    arrays = {"z.__call__": np.ones(2, np.float32), "a.__call__": np.zeros(3, np.float16)}
    order = {"0": "z.__call__", "1": "a.__call__"}
    _write(tmp_path / "v2.safetensors", arrays, {"order": json.dumps(order)})
    _write(tmp_path / "v1.safetensors", arrays, order)
    for name in ("v1", "v2"):
        got = inspector.read_from_safetensors(tmp_path / f"{name}.safetensors")
        assert list(got) == ["z.__call__", "a.__call__"]
        for key, value in arrays.items():
            np.testing.assert_array_equal(got[key], value)
            assert got[key].dtype == value.dtype


def test_plain_safetensors_files_and_bfloat16_convert_to_every_framework(tmp_path: Path) -> None:
    value = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    _write(tmp_path / "plain.safetensors", {"x": value}, {})
    got = inspector.read_from_safetensors(tmp_path / "plain.safetensors")
    assert got["x"].dtype == value.dtype and np.array_equal(got["x"], value)
    with pytest.raises(ValueError, match="host"):
        inspector.read_from_safetensors(tmp_path / "plain.safetensors", device="cuda")
    with pytest.raises(ValueError, match="framework"):
        inspector.read_from_safetensors(tmp_path / "plain.safetensors", framework="tf")

    torch = pytest.importorskip("torch")
    as_torch = inspector.read_from_safetensors(
        tmp_path / "plain.safetensors", framework="pt", device="cpu"
    )["x"]
    assert as_torch.dtype is torch.bfloat16 and as_torch.device.type == "cpu"
    assert np.array_equal(as_torch.float().numpy(), value.astype(np.float32))

    jax = pytest.importorskip("jax")
    as_jax = inspector.read_from_safetensors(
        tmp_path / "plain.safetensors", framework="jax", device="cpu"
    )["x"]
    assert as_jax.dtype == value.dtype and as_jax.devices() == {jax.devices("cpu")[0]}
    assert np.array_equal(np.asarray(as_jax), value)


def test_a_missing_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="capture directory"):
        inspector.read_from_safetensors(tmp_path / "nothing.safetensors")


def test_unflatten_nests_on_dots_and_keeps_clashing_keys() -> None:
    tree = _view.unflatten({"a.b.__call__": 1, "a.__call__": 2, "x": 3, "x.y": 4})
    assert tree == {"a": {"b": {"__call__": 1}, "__call__": 2}, "x": {"__value__": 3, "y": 4}}


def _capture(tmp_path: Path) -> Path:
    _write(
        tmp_path / "run.safetensors",
        {
            "blocks.0.__call__": np.arange(6, dtype=np.float32).reshape(2, 3),
            "blocks.0.__call__#1": np.array([np.nan, 1.0], np.float64),
            "__call__": np.zeros((0, 2), np.int32),
        },
        {},
    )
    return tmp_path / "run.safetensors"


def test_magnify_draws_a_rich_tree_in_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inspector.magnify(_capture(tmp_path))
    out = capsys.readouterr().out
    assert "blocks" in out and "__call__#1" in out
    assert "float32[2,3]" in out and "mean=2.5" in out and "max=5" in out
    assert "non-finite=1" in out and "(empty)" in out


def test_magnify_uses_treescope_in_a_notebook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    treescope = pytest.importorskip("treescope")
    shown: list[Any] = []
    monkeypatch.setattr(_view, "in_notebook", lambda: True)
    monkeypatch.setattr(treescope, "display", shown.append)
    inspector.magnify(_capture(tmp_path))
    (tree,) = shown
    assert set(tree) == {"blocks", "__call__"} and set(tree["blocks"]["0"]) == {
        "__call__",
        "__call__#1",
    }
    assert "blocks" in treescope.render_to_text(tree)


def test_in_notebook_is_false_in_a_terminal() -> None:
    assert not _view.in_notebook()
