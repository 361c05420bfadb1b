"""Dtypes, 0-d, layouts and autograd: saved exactly, as inputs and as intermediate points."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from torch import nn

import clouseau


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _exact(saved: np.ndarray, expected: np.ndarray) -> None:
    assert saved.dtype == expected.dtype and saved.shape == expected.shape
    # Compare the bytes: NaNs, -0.0 and bf16 all count.
    assert np.ascontiguousarray(saved).tobytes() == np.ascontiguousarray(expected).tobytes()


class Copy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.clone(x)  # keeps dtype and (for channels_last) the memory format
        return y.flatten()


TORCH_INPUTS = {
    "0-d": torch.tensor(3.25),
    "bool": torch.tensor([True, False, True]),
    "int8": torch.tensor([-128, -1, 0, 127], dtype=torch.int8),
    "uint8": torch.tensor([0, 255], dtype=torch.uint8),
    "int64": torch.tensor([-(2**62), 2**62]),
    "bf16": torch.tensor([1.0, -2.5, 3.0e38, float("nan")], dtype=torch.bfloat16),
    "fp16": torch.tensor([65504.0, -0.0, 1e-7, float("inf")], dtype=torch.float16),
    "float64": torch.tensor([1 / 3, -1e300, 5e-324], dtype=torch.float64),
    "non-contiguous": torch.arange(24.0).reshape(4, 6)[:, ::2].t(),
    "channels_last": torch.arange(120.0).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last),
    "requires_grad": torch.linspace(-1, 1, 5, requires_grad=True),
}


def test_torch_inputs_of_every_dtype_and_layout_are_saved_exactly(tmp_path: Path) -> None:
    model = Copy()
    with clouseau.instrument(model, path=tmp_path) as fmodel:
        for x in TORCH_INPUTS.values():
            out = fmodel(x)
            assert out.dtype == x.dtype and torch.equal(out.nan_to_num(), model(x).nan_to_num())
    cap = clouseau.load(tmp_path)
    assert cap.calls == tuple(range(len(TORCH_INPUTS)))
    for call, x in enumerate(TORCH_INPUTS.values()):
        _exact(cap.get("x", call=call), _np(x))
        _exact(cap.get("clone", call=call), _np(x))
        _exact(cap.get("flatten", call=call), _np(x.flatten()))


class Casts(nn.Module):
    """Intermediate points of every dtype, a non-contiguous view and a channels_last conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 1)

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        view = x.transpose(0, 1)  # non-contiguous
        bf16 = view.to(torch.bfloat16)
        fp16 = x.to(torch.float16)
        f64 = x.to(torch.float64)
        i8 = (x * 10).to(torch.int8)
        flag = x > 0
        total = x.sum()  # 0-d
        conv = self.conv(img)  # channels_last in, channels_last out
        return bf16, fp16, f64, i8, flag, total, conv


def test_torch_intermediate_points_of_every_dtype_and_layout(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Casts()
    x = torch.randn(4, 6, requires_grad=True)
    img = torch.randn(1, 3, 4, 4).to(memory_format=torch.channels_last)
    with clouseau.instrument(model, path=tmp_path) as fmodel:
        got = fmodel(x, img)
        sum(o.float().sum() for o in got if o.is_floating_point()).backward()
    expected = model(x, img)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert got[0].requires_grad and x.grad is not None  # autograd went through
    cap = clouseau.load(tmp_path)
    names = {
        "transpose": x.transpose(0, 1),
        "to": x.transpose(0, 1).to(torch.bfloat16),
        "to_1": x.to(torch.float16),
        "to_2": x.to(torch.float64),
        "to_3": (x * 10).to(torch.int8),
        "gt": x > 0,
        "sum": x.sum(),
        "conv": expected[-1],
    }
    for name, value in names.items():
        _exact(cap[name], _np(value))
    assert cap["sum"].shape == ()


def jax_casts(x: jax.Array) -> tuple[jax.Array, ...]:
    bf16 = x.astype(jnp.bfloat16)
    fp16 = x.astype(jnp.float16)
    i8 = (x * 10).astype(jnp.int8)
    flag = x > 0
    total = jnp.sum(x)
    return bf16, fp16, i8, flag, total


def test_jax_inputs_and_intermediates_of_every_dtype(tmp_path: Path) -> None:
    inputs = [
        np.float32(2.5),  # 0-d
        np.array([True, False]),
        np.array([-128, 0, 127], np.int8),
        np.array([1.0, -2.5, np.nan], ml_dtypes.bfloat16),
        np.array([65504.0, -0.0, np.inf], np.float16),
    ]

    def ident(x: jax.Array) -> jax.Array:
        return jnp.flip(jnp.atleast_1d(x))

    with clouseau.instrument(ident, path=tmp_path / "in") as fmodel:
        for x in inputs:
            _exact(np.asarray(fmodel(x)), np.asarray(ident(x)))
    cap = clouseau.load(tmp_path / "in")
    for call, x in enumerate(inputs):
        _exact(cap.get("x", call=call), np.asarray(x))

    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    with clouseau.instrument(jax_casts, path=tmp_path / "mid") as fmodel:
        outs = fmodel(x)
    cap = clouseau.load(tmp_path / "mid")
    for out, expected in zip(outs, jax_casts(x), strict=True):
        _exact(np.asarray(out), np.asarray(expected))
    saved = {cap[n].dtype for n in cap.names()}
    assert {np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.int8)} <= saved
    assert np.dtype(bool) in saved
    by_dtype = {cap[n].dtype: cap[n] for n in cap.names() if n != "x"}
    _exact(by_dtype[np.dtype(ml_dtypes.bfloat16)], np.asarray(outs[0]))
    _exact(by_dtype[np.dtype(np.int8)], np.asarray(outs[2]))
    _exact(by_dtype[np.dtype(bool)], np.asarray(outs[3]))


def double(x: jax.Array) -> jax.Array:
    return x * 2


def test_jax_float64_follows_jax_x64_setting() -> None:
    # Without jax_enable_x64, JAX itself computes a float64 input in float32; the capture
    # saves what the model computed, the input as JAX sees it.
    x = np.array([1 / 3, 2.0], np.float64)
    fmodel = clouseau.instrument(double, path=None)
    out = fmodel(x)
    _exact(fmodel.captured.get("x", call=0), np.asarray(jnp.asarray(x)))
    assert np.asarray(out).dtype == jnp.asarray(x).dtype
