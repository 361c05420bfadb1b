"""Every storable dtype (float8 e4m3fn and e5m2 included) is a point in both frameworks and round-trips bit for bit."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import clouseau

# Normal, subnormal, zero, negative zero and out-of-range values.
VALUES = np.array([[0.3, -1.7, 1e-3, 0.0], [-0.0, 300.0, -6e4, 2.5e-5]], np.float32)
FLOAT8 = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}


def _bits(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).view(np.uint8)


def test_torch_float8_casts_are_points_saved_bit_for_bit(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Quantize(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = (x * 2).to(torch.float8_e4m3fn)
            b = x.to(torch.float8_e5m2)
            return a.to(torch.float32) + b.to(torch.float32)

    x = torch.from_numpy(VALUES)
    graph = clouseau.trace(Quantize(), x)
    by_dtype = {p.dtype.value: p.name for p in graph.points}
    assert set(FLOAT8) <= set(by_dtype)
    fm = clouseau.instrument(Quantize(), select=[by_dtype[d] for d in FLOAT8], path=tmp_path)
    with fm:
        torch.testing.assert_close(fm(x), Quantize()(x), rtol=0, atol=0)
    cap = clouseau.load(tmp_path)
    want = {
        "float8_e4m3fn": (x * 2).to(torch.float8_e4m3fn),
        "float8_e5m2": x.to(torch.float8_e5m2),
    }
    for dtype, expected in want.items():
        got = cap[by_dtype[dtype]]
        assert got.dtype == np.dtype(FLOAT8[dtype])
        np.testing.assert_array_equal(_bits(got), expected.view(torch.uint8).numpy())


def test_torch_select_to_picks_the_float8_cast() -> None:
    torch = pytest.importorskip("torch")

    class Cast(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.to(torch.float8_e4m3fn)

    fm = clouseau.instrument(Cast(), select="to", path=None)
    with fm:
        fm(torch.from_numpy(VALUES))
    assert fm.captured.names() == ("to",)
    assert fm.captured["to"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)


def test_jax_float8_casts_are_points_saved_bit_for_bit(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def quantize(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return (x * 2).astype(jnp.float8_e4m3fn), x.astype(jnp.float8_e5m2)

    x = jnp.asarray(VALUES)
    graph = clouseau.trace(quantize, x)
    by_dtype = {p.dtype.value: p.name for p in graph.points}
    assert set(FLOAT8) <= set(by_dtype)
    fm = clouseau.instrument(quantize, select="*", path=tmp_path)
    with fm:
        a, b = fm(x)
    cap = clouseau.load(tmp_path)
    want = dict(zip(FLOAT8, jax.jit(quantize)(x), strict=True))
    for dtype, expected in want.items():
        got = cap[by_dtype[dtype]]
        assert got.dtype == np.dtype(FLOAT8[dtype])
        np.testing.assert_array_equal(_bits(got), _bits(np.asarray(expected)))
    np.testing.assert_array_equal(_bits(np.asarray(a)), _bits(np.asarray(want["float8_e4m3fn"])))
    np.testing.assert_array_equal(_bits(np.asarray(b)), _bits(np.asarray(want["float8_e5m2"])))


STORABLE = (
    "bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "float8_e4m3fn", "float8_e5m2",
)  # fmt: skip


def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


@pytest.mark.parametrize("dtype", STORABLE)
def test_torch_every_storable_dtype_is_a_point(dtype: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    target = getattr(torch, dtype)

    class Cast(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 3).to(target)

    x = torch.from_numpy(VALUES)
    fm = clouseau.instrument(Cast(), select="to", path=tmp_path)
    with fm:
        out = fm(x)
    got = clouseau.load(tmp_path)["to"]
    assert got.dtype == _numpy_dtype(dtype)
    np.testing.assert_array_equal(got.view(np.uint8), out.view(torch.uint8).numpy())


@pytest.mark.parametrize("dtype", [d for d in STORABLE if "64" not in d or d == "complex64"])
def test_jax_every_storable_dtype_is_a_point(dtype: str, tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")

    def cast(x: jax.Array) -> jax.Array:
        return (x * 3).astype(_numpy_dtype(dtype))

    x = jax.numpy.asarray(VALUES)
    last = clouseau.trace(cast, x).names()[-1]  # the cast (the product for float32)
    fm = clouseau.instrument(cast, select=last, path=tmp_path)
    with fm:
        out = np.asarray(fm(x))
    got = clouseau.load(tmp_path)[last]
    assert got.dtype == _numpy_dtype(dtype)
    np.testing.assert_array_equal(got.view(np.uint8), out.view(np.uint8))
