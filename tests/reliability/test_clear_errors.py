"""Errors that named neither the cause nor the fix (issue 15, items 7 and 16)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import clouseau
from clouseau.capture.torch import mark_leaf
from clouseau.ir.errors import CaptureError
from tests.reliability.models import Small, WithFailing


class _Complex(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.polar(self.fc(x).double(), x.double())  # complex128
        return z.abs().float()


def test_complex128_is_refused_at_trace_time_naming_the_point(tmp_path: Path) -> None:
    # It failed every call without naming the point or the fix.
    x = torch.randn(2, 4)
    fmodel = clouseau.instrument(_Complex(), path=tmp_path)
    with pytest.raises(CaptureError, match=r"point 'polar': cannot store dtype complex128") as info:
        fmodel(x)
    assert "select=[..., '!polar']" in str(info.value)
    fmodel.close()
    with clouseau.instrument(_Complex(), select=["*", "!polar"], path=tmp_path) as fmodel:
        out = fmodel(x)
    cap = clouseau.load(tmp_path)
    assert "polar" not in cap and torch.equal(out, fmodel.model(x))
    np.testing.assert_array_equal(cap["fc"], fmodel.model.fc(x).detach().numpy())


def test_a_model_on_the_meta_device_names_the_cause(tmp_path: Path) -> None:
    # It gave a raw NotImplementedError from deep inside torch.
    model = Small().to("meta")
    x = torch.empty(2, 4, device="meta")
    assert model(x).is_meta  # the model itself runs
    fmodel = clouseau.instrument(model, path=tmp_path)
    with pytest.raises(CaptureError, match=r"point 'x' is a meta tensor.*no values"):
        fmodel(x)
    fmodel.close()
    with clouseau.instrument(model, select=None, path=tmp_path) as fmodel:
        assert fmodel(x).shape == (2, 2)  # nothing to save: it runs


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("a" * 300, "has a component of 300 bytes"),
        ("cap\0ture", "contains a NUL character"),
    ],
)
def test_bad_paths_name_the_cause(tmp_path: Path, path: str, message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        clouseau.instrument(Small(), path=tmp_path / path)


def test_a_dangling_link_path_names_its_target(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(CaptureError, match=r"is a symbolic link to .*gone, which does not exist"):
        clouseau.instrument(Small(), path=tmp_path / "link")


def test_a_tilde_path_means_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "~/x" created a directory literally called "~".
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    x = torch.randn(2, 4)
    with clouseau.instrument(Small(), select="fc", path="~/caps/run") as fmodel:
        fmodel(x)
    assert not (tmp_path / "~").exists()
    assert clouseau.load(tmp_path / "home" / "caps" / "run").calls == (0,)


def test_an_over_limit_header_says_so(tmp_path: Path) -> None:
    # "claims N bytes but the file has N": the limit, not the size, was the problem.
    file = tmp_path / "x.safetensors"
    file.write_bytes(struct.pack("<Q", 2**40) + b"{}" * 100)
    with pytest.raises(CaptureError, match=r"claims 1099511627776 bytes, over the 100 MiB"):
        clouseau.load(file)


def test_a_torch_call_that_raises_keeps_nothing_of_itself(tmp_path: Path) -> None:
    # Item 7: docs/errors.md said a failing call kept what it saved before failing; the
    # torch graph hands its saved values over only when it returns, so it keeps nothing
    # (the doc now says so), and the calls around it are whole.
    model = WithFailing(RuntimeError("boom"))
    mark_leaf(model.fail)
    xs = [torch.randn(2, 4) for _ in range(3)]
    xs[1][0, 0] = 999.0  # the trigger of Failing
    with clouseau.instrument(model, select=["x", "fc"], path=tmp_path) as fmodel:
        fmodel(xs[0])
        with pytest.raises(RuntimeError, match="boom"):
            fmodel(xs[1])
        fmodel(xs[2])
    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 2) and dict(cap.failed_calls) == {1: "RuntimeError: boom"}
    assert not cap.partial_calls and cap.complete
    for call in (0, 2):
        np.testing.assert_array_equal(cap.get("x", call=call), xs[call].numpy())
