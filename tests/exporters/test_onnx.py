"""ONNX export: onnx.checker passes, onnxruntime runs it, and every output (the model's and
each activation, under its point name) equals what the framework computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import clouseau  # noqa: E402
from tests.exporters import models  # noqa: E402

TOL = 1e-5


def _run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL, err_msg=what)


@pytest.mark.parametrize(
    ("name", "select"),
    [
        ("mlp", "*"),
        ("cnn", "*"),
        ("resnet", ["layer*.*.relu*", "layer1", "fc"]),
        ("transformer", "*"),
    ],
)
def test_torch_outputs_and_activations_match(tmp_path: Path, name: str, select: object) -> None:
    torch = pytest.importorskip("torch")
    model, args = models.torch_models()[name]
    out = clouseau.export_onnx(model, args, tmp_path / "m.onnx", select=select)
    assert not model.training, "export must leave an eval() model in eval mode"
    fmodel = clouseau.instrument(model, select=select, path=None)
    with torch.no_grad():
        want = fmodel(*args)
    captured = fmodel.captured
    got = _run(out.path, {n: a.numpy() for n, a in zip(out.inputs, args, strict=True)})
    _close(got["output"], want.numpy(), "model output")
    assert out.points, "the selection exported no activation"
    assert set(out.points) <= set(got)
    for point in out.points:
        _close(got[point], captured[point], point)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_equinox_outputs_and_activations_match(tmp_path: Path, name: str) -> None:
    pytest.importorskip("equinox")
    model, args = models.equinox_models()[name]
    out = clouseau.export_onnx(model, args, tmp_path / "m.onnx", select="*")
    fmodel = clouseau.instrument(model, select="*", path=None)
    want = fmodel(*args)
    captured = fmodel.captured
    got = _run(out.path, {n: np.asarray(a) for n, a in zip(out.inputs, args, strict=True)})
    _close(got["output"], np.asarray(want), "model output")
    graph_points = {p.name for p in out.graph.points if p.node.kind.value == "op"}
    assert "relu" in out.points
    assert set(out.points) == {
        s.attr("names")[0] for s in out.graph.saves if s.inputs[0].node in graph_points
    }
    for point in out.points:
        _close(got[point], captured[point], point)


def test_onnx_outputs_are_model_outputs_then_points(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model, args = models.torch_models()["mlp"]
    out = clouseau.export_onnx(model, args, tmp_path / "m.onnx", select="fc*")
    assert out.outputs == ("output", "fc1", "fc2")
    assert out.points == ("fc1", "fc2")
    assert out.inputs == ("x",)


def test_select_none_exports_the_plain_model(tmp_path: Path) -> None:
    pytest.importorskip("equinox")
    model, args = models.equinox_models()["mlp"]
    out = clouseau.export_onnx(model, args, tmp_path / "m.onnx")
    assert out.outputs == ("output",) and out.points == ()


def test_unsupported_jax_primitive_names_node_and_op(tmp_path: Path) -> None:
    jnp = pytest.importorskip("jax.numpy")
    from clouseau.exporters.onnx_jax import UnsupportedOpError

    def f(x: object) -> object:
        return jnp.sort(x) * 2.0

    with pytest.raises(UnsupportedOpError, match=r"'sort'.*'sort'|sort.*primitive 'sort'"):
        clouseau.export_onnx(f, (jnp.arange(4.0),), tmp_path / "m.onnx", select="*")


def test_point_inside_a_jax_cond_is_refused_with_the_fix(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    from clouseau.exporters.onnx_jax import UnsupportedOpError

    def f(x: object) -> object:
        return jax.lax.cond(x.sum() > 0, jax.numpy.sin, jax.numpy.cos, x)  # type: ignore[attr-defined]

    with pytest.raises(
        UnsupportedOpError, match=r"'cond[.]sin[.]sin'.*cond.*select points outside"
    ):
        clouseau.export_onnx(f, (jax.numpy.ones(3),), tmp_path / "m.onnx", select="cond.sin.sin")


def test_jax_function_with_elementwise_and_reductions(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def f(x: object, w: object) -> object:
        h = jnp.tanh(x @ w) + jax.nn.sigmoid(x @ w) ** 2
        h = jnp.where(h > 0.5, jnp.exp(-h), jnp.sqrt(jnp.abs(h)))
        return jax.nn.log_softmax(h, axis=-1).max(axis=0), jnp.cumsum(h, axis=1)

    x = jax.random.normal(jax.random.PRNGKey(0), (3, 4))
    w = jax.random.normal(jax.random.PRNGKey(1), (4, 5))
    out = clouseau.export_onnx(f, (x, w), tmp_path / "f.onnx", select=["log_softmax", "tanh"])
    got = _run(out.path, {"x": np.asarray(x), "w": np.asarray(w)})
    for name, want in zip(("output_0", "output_1"), f(x, w), strict=True):
        _close(got[name], np.asarray(want), name)
    _close(got["tanh"], np.asarray(jnp.tanh(x @ w)), "tanh")
