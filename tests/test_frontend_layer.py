"""The frontend layer: each framework is a ``Frontend``; what both share is one code path.

Every value is compared with the framework itself (eager torch, plain JAX).
"""

from __future__ import annotations

import numpy as np
import pytest

import clouseau
import clouseau.ir.selection as selection
from clouseau.capture import Frontend, frontend_for, frontend_named
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


def _paths(frontend: Frontend, node: object, path: tuple[str, ...] = ()) -> set[str]:
    found = {".".join(path)}
    for name, child in frontend.children(node):
        found |= _paths(frontend, child, (*path, name))
    return found


def test_a_frontend_is_found_by_its_framework_name() -> None:
    for name in ("torch", "jax"):
        assert frontend_named(name) is getattr(clouseau.capture, name).FRONTEND
    with pytest.raises(ValueError, match="no frontend named 'tf'; one of torch, jax"):
        frontend_named("tf")


def test_children_are_named_as_the_tracer_names_module_paths() -> None:
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(3, 2))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), inner)
    graph = clouseau.trace(model, torch.randn(2, 4))
    assert _paths(frontend_named("torch"), model) == {m.path for m in graph.modules}
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.PRNGKey(0))
    graph = clouseau.trace(mlp, jax.numpy.ones(4))
    # The walk also reaches the leaves (weights) that are not modules of the IR.
    modules = {m.path for m in graph.modules}
    assert modules == {"", "layers.0", "layers.1", "layers.2"}
    assert modules <= _paths(frontend_named("jax"), mlp)


def test_only_the_torch_frontend_has_a_compile_backend() -> None:
    sink = RecordingSink()
    backend = frontend_named("torch").backend("1", sink, compiler="eager", intervene=None)
    model, x = _torch_model()
    want = model(x).detach().numpy()
    with backend:
        compiled = torch.compile(model, backend=backend)
        np.testing.assert_array_equal(compiled(x).detach().numpy(), want)
    assert sink.status == ["end"]
    np.testing.assert_array_equal(np.asarray(sink.values(0)["1"]), want)
    with pytest.raises(TypeError, match=r"for a JAX model use clouseau\.instrument"):
        frontend_named("jax").backend("*", RecordingSink(), compiler="eager", intervene=None)


def test_no_distributed_client_outside_a_multi_process_run() -> None:
    # Two initialized JAX processes are tests/distributed/test_jax_processes.py.
    assert frontend_named("jax").distributed_client() is None
    assert frontend_named("torch").distributed_client() is None
