"""Interventions and gradient capture on JAX/Equinox models, against hand-written functions."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

jax = pytest.importorskip("jax")
eqx = pytest.importorskip("equinox")
import jax.numpy as jnp  # noqa: E402

import clouseau  # noqa: E402

from ..jax.models import MLP, Block, _gelu_tanh, _heads, _layer_norm, _linear  # noqa: E402

Eps = dict[str, jax.Array]


def mlp_forward(
    model: MLP, x: jax.Array, act: Callable[[jax.Array], jax.Array], eps: Eps | None = None
) -> jax.Array:
    """The MLP by hand, with ``act`` after each ReLU and ``eps[name]`` added at each point."""
    eps = eps or {}
    for i, layer in enumerate(model.layers[:-1]):
        x = _linear(layer, x) + eps.get(f"layers.{i}", 0.0)
        x = act(jnp.maximum(x, 0)) + eps.get("relu" if i == 0 else f"relu_{i}", 0.0)
    return _linear(model.layers[-1], x)


@pytest.fixture(scope="module")
def mlp() -> MLP:
    return MLP((4, 8, 8, 3), key=jax.random.PRNGKey(0))


def _close(actual: object, expected: object) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("action", "fn"),
    [
        (clouseau.zero(), jnp.zeros_like),
        (clouseau.scale(0.25), lambda v: v * 0.25),
        (clouseau.clamp(0.1, 0.3), lambda v: jnp.clip(v, 0.1, 0.3)),
        (clouseau.replace(jnp.tanh), jnp.tanh),
    ],
    ids=["zero", "scale", "clamp", "replace"],
)
def test_action_on_every_relu_equals_the_hand_modified_function(mlp, action, fn):
    x = jax.random.normal(jax.random.PRNGKey(1), (4,))
    fmodel = clouseau.instrument(
        mlp, select=["relu", "layers.2"], path=None, intervene={"relu*": action}
    )
    y = fmodel(x)
    _close(y, mlp_forward(mlp, x, fn))
    cap = fmodel.captured
    _close(cap["relu"], fn(jnp.maximum(_linear(mlp.layers[0], x), 0)))  # saved after the change
    _close(cap["layers.2"], y)
    assert f"intervene[{action.describe()}](%relu)" in str(fmodel.trace(x))
    fmodel.close()


def test_interventions_work_under_jit_vmap_and_grad(mlp):
    xs = jax.random.normal(jax.random.PRNGKey(2), (3, 4))
    fmodel = clouseau.instrument(
        mlp, select="relu", path=None, intervene={"relu_1": clouseau.scale(-2.0)}
    )

    def expected(x: jax.Array) -> jax.Array:
        h = jnp.maximum(_linear(mlp.layers[0], x), 0)
        return _linear(mlp.layers[2], -2.0 * jnp.maximum(_linear(mlp.layers[1], h), 0))

    _close(eqx.filter_jit(fmodel)(xs[0]), expected(xs[0]))
    _close(jax.vmap(fmodel)(xs), jax.vmap(expected)(xs))
    _close(jax.grad(lambda x: fmodel(x).sum())(xs[0]), jax.grad(lambda x: expected(x).sum())(xs[0]))
    assert not np.allclose(np.asarray(mlp(xs[0])), np.asarray(expected(xs[0])))
    fmodel.close()


def test_patch_from_a_capture_of_input_a_into_a_run_on_input_b(mlp):
    a, b = jax.random.normal(jax.random.PRNGKey(3), (2, 4))
    with clouseau.instrument(mlp, select="relu", path=None) as recorder:
        recorder(a)
    source = recorder.captured
    fmodel = clouseau.instrument(
        mlp, select=None, path=None, intervene={"relu": clouseau.patch(source)}
    )
    relu_a = jnp.maximum(_linear(mlp.layers[0], a), 0)
    expected = _linear(mlp.layers[2], jnp.maximum(_linear(mlp.layers[1], relu_a), 0))
    _close(fmodel(b), expected)
    _close(eqx.filter_jit(fmodel)(b), expected)
    fmodel.close()


def test_nothing_to_intervene_leaves_the_graph_unchanged(mlp):
    x = jnp.ones((4,))
    plain = clouseau.instrument(mlp, select="relu", path=None)
    empty = clouseau.instrument(mlp, select="relu", path=None, intervene={}, grads=False)
    assert str(plain.trace(x)) == str(empty.trace(x))


# --- gradients ---------------------------------------------------------------------------


def test_saved_gradients_equal_the_gradients_of_a_hand_written_mlp(mlp):
    x = jax.random.normal(jax.random.PRNGKey(4), (4,))
    names = ("layers.0", "relu", "layers.1", "relu_1")
    fmodel = clouseau.instrument(mlp, select=list(names), path=None, grads=True)
    loss = lambda m, v: jnp.sum(jnp.sin(m(v)))  # noqa: E731
    value, _ = jax.value_and_grad(loss)(fmodel, x)
    jax.effects_barrier()
    eps = {n: jnp.zeros(8) for n in names}
    expected = jax.jit(jax.grad(lambda e: loss(lambda v: mlp_forward(mlp, v, lambda a: a, e), x)))(
        eps
    )
    cap = fmodel.captured
    for name in names:
        _close(cap[f"{name}.grad"], expected[name])
        assert cap.records[[r.name for r in cap.records].index(f"{name}.grad")].call == 0
    _close(value, loss(mlp, x))
    # Under vmap each gradient keeps the batch axis, in one call.
    xs = jax.random.normal(jax.random.PRNGKey(5), (3, 4))
    jax.vmap(jax.grad(lambda v: loss(fmodel, v)))(xs)
    jax.effects_barrier()
    batched = jax.jit(
        jax.vmap(
            lambda v: jax.grad(lambda e: loss(lambda u: mlp_forward(mlp, u, lambda a: a, e), v))(
                eps
            )
        )
    )(xs)
    _close(fmodel.captured.get("relu.grad", call=1), batched["relu"])
    fmodel.close()


def block_forward(model: Block, x: jax.Array, eps: Eps) -> jax.Array:
    """The transformer block by hand, with ``eps[name]`` added at each named point."""
    e = lambda name: eps.get(name, 0.0)  # noqa: E731
    ln1 = jax.vmap(lambda r: _layer_norm(model.ln1, r))(x) + e("ln1")
    qkv = jax.vmap(lambda r: _linear(model.attn.qkv, r))(ln1)
    q, k, v = _heads(qkv, model.attn.heads)
    scores = q @ k.swapaxes(-1, -2) / jnp.sqrt(q.shape[-1])
    weights = jax.nn.softmax(scores, axis=-1) + e("attn.softmax")
    y = (weights @ v).swapaxes(0, 1).reshape(x.shape)
    attn = jax.vmap(lambda r: _linear(model.attn.proj, r))(y) + e("attn")
    x1 = x + attn + e("add")
    ln2 = jax.vmap(lambda r: _layer_norm(model.ln2, r))(x1) + e("ln2")
    fc1 = jax.vmap(lambda r: _linear(model.fc1, r))(ln2) + e("fc1")
    gelu = _gelu_tanh(fc1) + e("gelu")
    return x1 + jax.vmap(lambda r: _linear(model.fc2, r))(gelu)


def test_saved_gradients_equal_the_gradients_of_a_hand_written_transformer_block():
    block = Block(key=jax.random.PRNGKey(6))
    x = jax.random.normal(jax.random.PRNGKey(7), (5, 8))
    names = ("ln1", "attn.softmax", "attn", "add", "ln2", "fc1", "gelu")
    fmodel = clouseau.instrument(block, select=None, path=None, grads=list(names))
    loss = lambda f: jnp.mean(f(x) ** 3)  # noqa: E731
    jax.jit(jax.grad(lambda m: loss(m)))(fmodel)
    jax.effects_barrier()
    shapes = {"attn.softmax": (2, 5, 5), "fc1": (5, 16), "gelu": (5, 16)}
    eps = {n: jnp.zeros(shapes.get(n, (5, 8))) for n in names}
    # Jitted: op-by-op dispatch of the reference would dominate the test time.
    expected = jax.jit(jax.grad(lambda e: loss(lambda v: block_forward(block, v, e))))(eps)
    cap = fmodel.captured
    for name in names:
        np.testing.assert_allclose(
            cap[f"{name}.grad"], np.asarray(expected[name]), rtol=1e-4, atol=1e-6
        )
    fmodel.close()


def test_interventions_inside_a_scan_body_and_on_an_input():
    from ..jax.models import scan_mlp, scan_params

    params = scan_params(jax.random.PRNGKey(8))
    x = jax.random.normal(jax.random.PRNGKey(9), (6,))
    # "x" alone would also pick the scan's slices "scan.x*": the input is op "input".
    the_input = clouseau.Selector.glob("x") & clouseau.Selector.op("input")
    fmodel = clouseau.instrument(
        scan_mlp,
        select="scan.tanh",
        path=None,
        intervene={"scan.tanh": clouseau.clamp(hi=0.2), the_input: clouseau.add(1.0)},
    )

    def expected(x: jax.Array) -> jax.Array:
        h = x + 1.0
        for w, b in zip(params["w"], params["b"], strict=True):
            h = jnp.minimum(jnp.tanh(w @ h + b), 0.2)
        return h @ params["out"]

    _close(fmodel(params, x), expected(x))
    _close(jax.jit(fmodel)(params, x), expected(x))
    assert np.max(fmodel.captured.get("scan.tanh", call=0)) <= np.float32(0.2)
    with pytest.warns(UserWarning, match="scan"):
        grads = clouseau.instrument(scan_mlp, select=None, path=None, grads="scan.tanh")
        jax.grad(lambda v: grads(params, v).sum())(x)
    fmodel.close()
    grads.close()
