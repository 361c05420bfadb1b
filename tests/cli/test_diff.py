"""``clouseau.diff`` and ``clouseau diff``: framework-free cases, then PyTorch vs Equinox."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

import clouseau
from clouseau.cli import main
from clouseau.ir import SavedValue
from clouseau.store import DirectorySink
from clouseau.store.diff import DisjointCapturesError, Status, compare, diff


def write_capture(path: Path, calls: Iterable[dict[str, np.ndarray]]) -> Path:
    """A capture directory written through the store, one dict of name -> array per call."""
    sink = DirectorySink(path)
    for values in calls:
        call = sink.begin_call()
        sink.put(call, 0, [SavedValue((name,), name, array) for name, array in values.items()])
        sink.end_call(call)
    sink.close()
    return path


def arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "conv": rng.normal(size=(2, 3, 4)).astype(np.float32),
        "relu": np.maximum(rng.normal(size=(2, 5)), 0).astype(np.float32),
        "fc": rng.normal(size=(2, 4)).astype(np.float32),
    }


def test_compare_reports_abs_rel_and_count() -> None:
    a = np.array([1.0, 2.0, 3.0, np.nan], np.float32)
    b = a.copy()
    b[1] += 0.5
    row = compare("p", "p", 0, a, b, rtol=1e-5, atol=1e-6)
    assert row.status is Status.DIFFERS and row.exceeding == 1
    assert row.max_abs == pytest.approx(0.5) and row.max_rel == pytest.approx(0.5 / 2.5)
    assert compare("p", "p", 0, a, a, 0, 0).status is Status.CLOSE  # NaN == NaN in place
    b[3] = 1.0
    assert compare("p", "p", 0, a, b, 1, 1).max_abs == np.inf  # NaN facing a number
    assert compare("p", "p", 0, a, a[:3], 1, 1).status is Status.SHAPE


def test_identical_captures_match(tmp_path: Path) -> None:
    a = write_capture(tmp_path / "a", [arrays(), arrays(1)])
    b = write_capture(tmp_path / "b", [arrays(), arrays(1)])
    result = clouseau.diff(a, b)
    assert result.ok and result.first_divergence is None
    assert [(r.name, r.call) for r in result.rows] == [
        (n, c) for c in (0, 1) for n in ("conv", "relu", "fc")
    ]
    assert main(["diff", str(a), str(b)]) == 0


def test_first_divergence_in_execution_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = arrays(), arrays()
    bad["relu"] = bad["relu"] + 1e-2
    bad["fc"] = bad["fc"][:, :3]
    a = write_capture(tmp_path / "a", [good])
    b = write_capture(tmp_path / "b", [bad])
    result = diff(a, b)
    assert not result.ok
    assert [r.status for r in result.rows] == [Status.CLOSE, Status.DIFFERS, Status.SHAPE]
    first = result.first_divergence
    assert first is not None and first.name == "relu" and first.exceeding == good["relu"].size
    assert first.max_abs == pytest.approx(float(np.abs(bad["relu"] - good["relu"]).max()))
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "first divergence: relu" in out and "shape mismatch" in out


def test_tolerances_and_missing_points(tmp_path: Path) -> None:
    near = {k: v * (1 + 1e-3) for k, v in arrays().items()}
    del near["conv"]
    a = write_capture(tmp_path / "a", [arrays()])
    b = write_capture(tmp_path / "b", [near])
    assert not diff(a, b).ok
    loose = diff(a, b, rtol=1e-2)
    assert loose.ok and loose.count(Status.ONLY_A) == 1
    assert not diff(a, b, rtol=1e-2, strict=True).ok
    assert main(["diff", str(a), str(b), "--rtol", "1e-2"]) == 0
    assert main(["diff", str(a), str(b), "--rtol", "1e-2", "--strict"]) == 1


def test_key_map_and_disjoint_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_capture(tmp_path / "a", [arrays()])
    renamed = {f"net.{k}": v for k, v in arrays().items()}
    b = write_capture(tmp_path / "b", [renamed])
    with pytest.raises(DisjointCapturesError, match="key_map"):
        diff(a, b)
    assert diff(a, b, key_map={"^": "net."}).ok
    assert diff(a, b, key_map=lambda n: "net." + n).ok
    assert main(["diff", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "--key-map" in err and "Traceback" not in err
    assert main(["diff", str(a), str(b), "--key-map", "^", "net."]) == 0


def test_user_errors_exit_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    for argv in (["show", str(tmp_path / "empty")], ["diff", str(tmp_path / "nope"), str(tmp_path)],
                 ["draw", str(tmp_path / "empty"), "-o", str(tmp_path / "g.pdf")]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "error:" in err.splitlines()[0] and "Traceback" not in err


# -- PyTorch vs Equinox ---------------------------------------------------------------------
def torch_and_equinox(perturb: float = 0.0) -> tuple[object, object, np.ndarray]:
    """One MLP in both frameworks with the same weights; ``perturb`` shifts one JAX weight."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    eqx = pytest.importorskip("equinox")
    from tests.exporters.models import equinox_models

    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).eval()
    jmodel, _ = equinox_models()["mlp"]
    w = [jnp.asarray(tmodel[i].weight.detach().numpy()) for i in (0, 2)]
    b = [jnp.asarray(tmodel[i].bias.detach().numpy()) for i in (0, 2)]
    w[1] = w[1].at[0, 0].add(perturb)
    jmodel = eqx.tree_at(
        lambda m: (m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias),
        jmodel,
        (w[0], b[0], w[1], b[1]),
    )
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    return tmodel, jmodel, x


TORCH_TO_EQX = {r"^0$": "fc1", r"^1$": "relu", r"^2$": "fc2"}


def capture_both(tmp_path: Path, perturb: float = 0.0) -> tuple[Path, Path]:
    import jax.numpy as jnp
    import torch

    tmodel, jmodel, x = torch_and_equinox(perturb)
    with clouseau.instrument(tmodel, select="*", path=tmp_path / "torch") as f:
        f(torch.from_numpy(x))
    with clouseau.instrument(jmodel, select=["fc1", "relu", "fc2"], path=tmp_path / "jax") as f:
        f(jnp.asarray(x))
    return tmp_path / "torch", tmp_path / "jax"


def test_torch_vs_equinox_same_weights_all_close(tmp_path: Path) -> None:
    a, b = capture_both(tmp_path)
    result = clouseau.diff(a, b, key_map=TORCH_TO_EQX)
    assert result.ok, result
    compared = [(r.name, r.other) for r in result.compared]
    assert compared == [("0", "fc1"), ("1", "relu"), ("2", "fc2")]
    argv = ["diff", str(a), str(b)] + [x for p in TORCH_TO_EQX.items() for x in ("--key-map", *p)]
    assert main(argv) == 0


def test_torch_vs_equinox_perturbed_weight_names_first_divergence(tmp_path: Path) -> None:
    a, b = capture_both(tmp_path, perturb=0.05)
    result = clouseau.diff(a, b, key_map=TORCH_TO_EQX)
    assert not result.ok
    first = result.first_divergence
    assert first is not None and (first.name, first.other) == ("2", "fc2")
    argv = ["diff", str(a), str(b)] + [x for p in TORCH_TO_EQX.items() for x in ("--key-map", *p)]
    assert main(argv) == 1
    done = subprocess.run(
        [sys.executable, "-m", "clouseau.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "first divergence: 2 -> fc2" in " ".join(done.stdout.split())
