"""The frontend layer: each framework is a ``Frontend``; what both share is one code path.

Every value is compared with the framework itself (eager torch, plain JAX).
"""

from __future__ import annotations

import numpy as np
import pytest

import clouseau
import clouseau.ir.selection as selection
from clouseau.capture import Frontend, frontend_for
from clouseau.capture._common import SinkCall, user_frame
from tests.conftest import RecordingSink

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")


def _torch_model() -> tuple[object, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    return model, torch.randn(2, 4)


def _jax_model(x: object) -> object:
    return jax.nn.relu(x * 2.0)


def test_each_framework_is_a_frontend_named_after_it() -> None:
    model, _ = _torch_model()
    found = {"torch": frontend_for(model), "jax": frontend_for(_jax_model, (np.ones(3),))}
    for name, frontend in found.items():
        assert isinstance(frontend, Frontend)
        assert frontend.name == name
        assert frontend is getattr(clouseau.capture, name).FRONTEND


def test_a_frontend_traces_and_lowers_as_its_framework_runs() -> None:
    model, x = _torch_model()
    frontend = frontend_for(model)
    assert frontend.trace(model, x).names() == clouseau.trace(model, x).names()
    lowered = frontend.lower(model, (x,), {}, "1")
    out, saved = lowered.module(x)
    np.testing.assert_array_equal(out.detach().numpy(), model(x).detach().numpy())
    np.testing.assert_array_equal(saved[0].detach().numpy(), model(x).detach().numpy())


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_select_is_checked_once_per_instrument(
    framework: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[object] = []
    as_selector = selection.as_selector
    monkeypatch.setattr(selection, "as_selector", lambda s: checked.append(s) or as_selector(s))
    model = _torch_model()[0] if framework == "torch" else _jax_model
    select = ["relu*", "!x"]
    with clouseau.instrument(model, select=select, path=None):
        pass
    assert sum(s is select for s in checked) == 1  # before: by the API, then the frontend
    with pytest.raises(clouseau.SelectionError, match="invalid glob"):
        clouseau.instrument(model, select=["relu*", ""], path=None)


def test_sink_call_ends_a_call_or_fails_it_with_the_error() -> None:
    sink = RecordingSink()
    with SinkCall(sink) as call:
        sink.put(call, 0, [])
    with pytest.raises(ValueError, match="boom"), SinkCall(sink) as call:
        raise ValueError("boom")
    with SinkCall(sink, call=0):  # a call numbered earlier is not begun again
        pass
    assert sink.status == ["end", "fail"]
    assert [type(e) for e in sink.errors] == [ValueError]


def test_a_failing_call_is_recorded_by_both_frontends() -> None:
    for framework in ("torch", "jax"):
        sink = RecordingSink()
        if framework == "torch":
            model, x = _torch_model()
            fm = clouseau.capture.torch.instrument(model, select="*", sink=sink)
        else:
            model, x = _jax_model, np.ones(3, np.float32)
            fm = clouseau.capture.jax.instrument(model, select="*", sink=sink)
        fm(x)
        sink.fail_put = True
        with pytest.raises(OSError, match="disk full"):
            fm(x)
        assert sink.status == ["end", "fail"], framework


def test_user_frame_is_the_innermost_frame_outside_the_libraries() -> None:
    def inner() -> None:
        raise RuntimeError("x")

    try:
        inner()
    except RuntimeError as error:
        frame = user_frame(error, lambda file: False)
        assert frame is not None and frame.name == "inner"
        outer = user_frame(error, lambda file: file.endswith("test_frontend_layer.py"))
        assert outer is None
        # Outside the traceback: the innermost frame of the stack outside the libraries,
        # here pytest's, which called this test.
        ours = lambda file: file.endswith("test_frontend_layer.py") or "/clouseau/" in file  # noqa: E731
        here = user_frame(error, ours, or_stack=True)
        assert here is not None and "_pytest" in here.filename
