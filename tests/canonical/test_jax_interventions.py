"""Interventions and ``grads=`` on JAX computed points: an intervention on the pattern or
scores of ``jax.nn.dot_product_attention`` replaces the kernel by its decomposition, equal
to the same change written into a copy of the model's attention; a gradient of the pattern
is ``jax.grad`` of that copy w.r.t. its weights; under the user's ``jit``, ``vmap``,
``grad`` and per iteration of ``lax.scan`` (``head_out`` too). Gradients of views (logit
lens, per-head outputs) refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import clouseau
from clouseau.capture import jax as cj

jax = pytest.importorskip("jax")
eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")
jnp = jax.numpy

from tests.canonical.jax_models import HEADS, GqaModel, NnxGPT  # noqa: E402
from tests.canonical.test_jax import GPT  # noqa: E402
from tests.canonical.test_jax_computed import IDS, Steps  # noqa: E402
from tests.conftest import RecordingSink  # noqa: E402

#: The decomposition rounds differently from the fused kernel; float32, two blocks.
TOL = 1e-5
X = jax.random.normal(jax.random.key(1), (1, 6, 32))
Fn = Callable[[Any], Any]


def _ablate_head_1(pattern: Any) -> Any:
    return pattern.at[:, 1].set(0.0)


def _uniform(pattern: Any) -> Any:
    """Each query attends equally to every key it may see (the masked ones stay zero)."""
    seen = (pattern > 0).astype(pattern.dtype)
    return seen / seen.sum(-1, keepdims=True)


def _halve(scores: Any) -> Any:
    return scores * 0.5


def _same(value: Any) -> Any:
    return value


def _attention(scores: Any, v: Any, fn: Fn, before: bool) -> tuple[Any, Any]:
    """``softmax(scores) @ v`` with ``fn`` on the scores (``before``) or on the pattern."""
    scores = fn(scores) if before else scores
    pattern = jax.nn.softmax(scores, axis=-1)
    pattern = pattern if before else fn(pattern)
    return jnp.einsum("bhqk,bkhd->bqhd", pattern, v), pattern


def _gqa_by_hand(
    model: GqaModel, x: Any, layer: int, fn: Fn, before: bool, z: Fn = _same
) -> tuple[Any, Any]:
    """GqaModel's forward, its attention written out, ``fn`` patched into block ``layer``'s
    (and ``z`` on its ``[batch, pos, head, d_head]`` output): the logits and that block's
    pattern."""
    t = x.shape[-2]
    pos = jnp.arange(t)
    alibi = -0.5 * jnp.abs(pos[:, None] - pos[None, :]) * jnp.arange(1, HEADS + 1)[:, None, None]
    keep = jnp.tril(jnp.ones((t, t), bool)) & (pos < t - 1)[None, :]
    seen = None
    for i, block in enumerate(model.blocks):
        attn, h = block.attn, block.ln_1(x)
        q = attn.q_proj(h).reshape(1, t, HEADS, 8)
        k, v = (a.reshape(1, t, 2, 8) for a in jnp.split(attn.kv_proj(h), 2, -1))
        k, v = jnp.repeat(k, HEADS // 2, axis=2), jnp.repeat(v, HEADS // 2, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        if i == 0:
            scores = scores * 0.3 + alibi
        else:
            scores = jnp.where(keep, scores / jnp.sqrt(8.0), -jnp.inf)
        y, pattern = _attention(scores, v, fn if i == layer else _same, before)
        seen, y = (pattern, z(y)) if i == layer else (seen, y)
        x = x + attn.o_proj(y.reshape(1, t, 32))
        x = x + block.mlp(jax.nn.gelu(block.ln_2(x)))
    return model.head(model.ln_f(x)), seen


CASES = [
    ("blocks.0.attn.pattern", _ablate_head_1),
    ("blocks.1.attn.pattern", _uniform),
    ("blocks.0.attn.scores", _halve),
    ("blocks.1.attn.scores", _halve),
]
IDS_OF = ["ablate-head", "uniform", "scores-bias", "scores-mask"]


@pytest.mark.parametrize(("name", "fn"), CASES, ids=IDS_OF)
def test_an_intervention_on_a_fused_pattern_is_the_patched_attention(name: str, fn: Fn) -> None:
    model = GqaModel(jax.random.key(0))
    layer, before = int(name.split(".")[1]), name.endswith("scores")
    want, weights = jax.jit(_gqa_by_hand, static_argnums=(2, 3, 4))(model, X, layer, fn, before)
    plain = eqx.filter_jit(model)(X)
    pattern = f"blocks.{layer}.attn.pattern"
    fmodel = clouseau.instrument(
        model, select=[name, pattern], path=None, intervene={name: clouseau.replace(fn)}
    )
    for call in range(2):
        got = fmodel(X)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
        assert np.abs(np.asarray(got - plain)).max() > 10 * TOL  # it reached the outputs
        # The saved pattern is the one the model read: intervened, or the softmax of the
        # intervened scores.
        seen = fmodel.captured.get(pattern, call=call)
        np.testing.assert_allclose(seen, weights, rtol=0, atol=1e-6)


def _nnx_by_hand(model: NnxGPT, ids: Any, fn: Fn) -> Any:
    """NnxGPT's forward, its attention written out, ``fn`` on block 0's pattern."""
    x = model.wte(ids) + model.wpe(jnp.cumsum(ids >= 0, axis=-1) - 1)
    mask = nnx.make_causal_mask(ids)
    for i, block in enumerate(model.blocks):
        h = block.ln_1(x)
        q, k, v = block.attn.query(h), block.attn.key(h), block.attn.value(h)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
        scores = jnp.where(mask, scores, -jnp.inf)
        z, _ = _attention(scores, v, fn if i == 0 else _same, before=False)
        x = x + block.attn.out(z)
        x = x + block.down(nnx.gelu(block.up(block.ln_2(x))))
    return model.head(model.ln_f(x))


def test_an_intervention_on_a_flax_nnx_pattern_is_the_patched_attention() -> None:
    model = NnxGPT(nnx.Rngs(0))
    want = nnx.jit(_nnx_by_hand, static_argnums=2)(model, IDS, _ablate_head_1)
    plain = nnx.jit(lambda m, a: m(a))(model, IDS)
    fmodel = clouseau.instrument(
        model, select="blocks.0.attn.pattern", path=None,
        intervene={"blocks.0.attn.pattern": clouseau.replace(_ablate_head_1)},
    )  # fmt: skip
    got = fmodel(IDS)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    assert np.abs(np.asarray(got - plain)).max() > 10 * TOL
    assert not fmodel.captured["blocks.0.attn.pattern"][:, 1].any()
    same = clouseau.instrument(
        model, select="logits", path=None, intervene={"pattern": clouseau.scale(1.0)}
    )
    np.testing.assert_allclose(same(IDS), plain, rtol=0, atol=TOL)


def test_an_identity_intervention_on_every_pattern_keeps_the_outputs() -> None:
    model = GqaModel(jax.random.key(0))
    plain = eqx.filter_jit(model)(X)
    for target in ("pattern", "scores"):
        fmodel = clouseau.instrument(
            model, select="resid_post", path=None, intervene={target: clouseau.scale(1.0)}
        )
        np.testing.assert_allclose(fmodel(X), plain, rtol=0, atol=TOL)


def test_a_pattern_intervention_under_jit_vmap_grad_and_scan(sink: Any) -> None:
    model = GqaModel(jax.random.key(0))
    name, fn = "blocks.1.attn.pattern", _ablate_head_1
    hand = jax.jit(lambda x: _gqa_by_hand(model, x, 1, fn, False)[0])
    xs = jax.random.normal(jax.random.key(2), (3, 1, 6, 32))
    fm = cj.instrument(model, select=name, sink=sink, intervene={name: clouseau.replace(fn)})
    with fm:
        np.testing.assert_allclose(jax.jit(lambda x: fm(x))(xs[0]), hand(xs[0]), atol=TOL)
        np.testing.assert_allclose(jax.vmap(lambda x: fm(x))(xs), jax.vmap(hand)(xs), atol=TOL)
        got = jax.grad(lambda x: fm(x).sum())(xs[1])
        np.testing.assert_allclose(got, jax.grad(lambda x: hand(x).sum())(xs[1]), atol=TOL)
        _, ys = jax.lax.scan(lambda c, x: (c, fm(x)), 0.0, xs)
        np.testing.assert_allclose(ys, jax.vmap(hand)(xs), rtol=0, atol=TOL)
    calls = [sink.values(i) for i in range(len(sink.calls)) if sink.calls[i]]
    assert len(calls) == 1 + 1 + 1 + 3
    for values in calls:  # the saved pattern is the intervened one, in every call
        assert not np.asarray(values[name])[..., 1, :, :].any()


def test_a_pattern_intervention_inside_the_models_scan_is_per_iteration() -> None:
    model = Steps(GqaModel(jax.random.key(0)))
    xs = jax.random.normal(jax.random.key(2), (3, 1, 6, 32))
    name = "blocks.0.attn.scores"
    fmodel = clouseau.instrument(
        model, select=[name, "blocks.0.attn.pattern"], path=None,
        intervene={name: clouseau.replace(_halve)},
    )  # fmt: skip
    out = fmodel(xs)
    hand = jax.jit(lambda x: _gqa_by_hand(model.inner, x, 0, _halve, True))
    cap = fmodel.captured
    for i, x in enumerate(xs):  # one value per iteration, the iteration axis in front
        want, weights = hand(x)
        np.testing.assert_allclose(out[i], want, rtol=0, atol=TOL)
        np.testing.assert_allclose(cap["blocks.0.attn.pattern"][i], weights, rtol=0, atol=1e-6)


class _OwnAttention(eqx.Module):
    """GqaAttention's weights, its weights computed by the model (no fused kernel)."""

    attn: Any

    def __call__(self, x: Any, extra: Any) -> Any:
        attn, (b, t, c) = self.attn, x.shape
        q = attn.q_proj(x).reshape(b, t, HEADS, 8)
        k, v = (a.reshape(b, t, 2, 8) for a in jnp.split(attn.kv_proj(x), 2, -1))
        k, v = jnp.repeat(k, HEADS // 2, axis=2), jnp.repeat(v, HEADS // 2, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        if attn.bias:
            scores = scores * 0.3 + extra
        else:
            keep = extra & jnp.tril(jnp.ones((t, t), bool))
            scores = jnp.where(keep, scores / jnp.sqrt(8.0), -jnp.inf)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return attn.o_proj(y.reshape(b, t, c))


def test_an_intervention_on_a_models_own_pattern_changes_it() -> None:
    fused = GqaModel(jax.random.key(0))
    model = eqx.tree_at(
        lambda m: [b.attn for b in m.blocks], fused, [_OwnAttention(b.attn) for b in fused.blocks]
    )
    graph = clouseau.trace(model, X)
    assert not [n for n in graph.nodes if n.op == "dot_product_attention"]
    name = "blocks.1.attn.pattern"
    assert name in graph.names()
    want, weights = jax.jit(lambda x: _gqa_by_hand(fused, x, 1, _ablate_head_1, False))(X)
    fmodel = clouseau.instrument(
        model, select=name, path=None, intervene={name: clouseau.replace(_ablate_head_1)}
    )
    np.testing.assert_allclose(fmodel(X), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(fmodel.captured[name], weights, rtol=0, atol=1e-6)


def test_the_gradient_of_a_models_own_pattern_is_jax_grad_of_it() -> None:
    fused = GqaModel(jax.random.key(0))
    model = eqx.tree_at(
        lambda m: [b.attn for b in m.blocks], fused, [_OwnAttention(b.attn) for b in fused.blocks]
    )
    _, _, saved = _grads(model, X, grads="blocks.1.attn.pattern")

    def hand(d: Any) -> Any:
        return _gqa_by_hand(fused, X, 1, lambda p: p + d, False)[0].sum()

    want = jax.jit(jax.grad(hand))(jnp.zeros((1, HEADS, 6, 6)))
    np.testing.assert_allclose(saved["blocks.1.attn.pattern.grad"], want, rtol=0, atol=TOL)


def _grads(model: Any, x: Any, **kw: Any) -> tuple[Any, Any, dict]:
    """The loss, its input gradient and the saved gradients of one ``jax.grad`` call."""
    sink = RecordingSink()
    fm = cj.instrument(model, select=None, sink=sink, **kw)
    with fm:
        loss, grad = jax.value_and_grad(lambda x: fm(x).sum())(x)
    return loss, grad, sink.values(len(sink.calls) - 1)


@pytest.mark.parametrize("what", ["pattern", "scores"])
def test_the_gradient_of_a_fused_pattern_is_jax_grad_of_the_attention(what: str) -> None:
    model = GqaModel(jax.random.key(0))
    loss_plain, grad_plain = jax.value_and_grad(lambda x: model(x).sum())(X)
    before = what == "scores"
    for layer in (0, 1):
        name = f"blocks.{layer}.attn.{what}"
        loss, grad, saved = _grads(model, X, grads=name)
        # The forward is the kernel's; the backward, the decomposition's.
        np.testing.assert_allclose(loss, loss_plain, rtol=1e-6)
        np.testing.assert_allclose(grad, grad_plain, rtol=0, atol=TOL)
        shape = (1, HEADS, 6, 6)

        def hand(d: Any, layer: int = layer) -> Any:
            out = _gqa_by_hand(model, X, layer, lambda p: p + d, before)[0]
            return out.sum()

        want = jax.jit(jax.grad(hand))(jnp.zeros(shape))
        got = np.asarray(saved[f"{name}.grad"])
        keep = np.isfinite(np.asarray(want))
        np.testing.assert_allclose(got[keep], np.asarray(want)[keep], rtol=0, atol=TOL)


def test_gradients_of_an_intervened_pattern_and_of_both_points_of_one_kernel() -> None:
    model = GqaModel(jax.random.key(0))
    name = "blocks.1.attn.pattern"
    _, grad, saved = _grads(
        model, X, grads=[name, "blocks.1.attn.scores"],
        intervene={name: clouseau.replace(_ablate_head_1)},
    )  # fmt: skip

    def hand(x: Any, d: Any) -> Any:
        return _gqa_by_hand(model, x, 1, lambda p: _ablate_head_1(p) + d, False)[0].sum()

    zeros = jnp.zeros((1, HEADS, 6, 6))
    want_x, want_d = jax.jit(jax.grad(hand, argnums=(0, 1)))(X, zeros)
    # One backward pass through the decomposition: the input gradient is not counted twice.
    np.testing.assert_allclose(grad, want_x, rtol=0, atol=TOL)
    np.testing.assert_allclose(saved[f"{name}.grad"], want_d, rtol=0, atol=TOL)
    assert "blocks.1.attn.scores.grad" in saved


def _gpt_by_hand(model: GPT, ids: Any, layer: int, fn: Fn) -> Any:
    """The Equinox GPT's forward with ``fn`` on block ``layer``'s ``z`` (``[b, pos, head,
    d_head]``) before its output projection: a head ablation written into the model."""
    x = model.wte[ids]
    for i, block in enumerate(model.blocks):
        attn, h = block.attn, block.ln_1(x)
        b, t, c = h.shape
        q, k, v = (a.reshape(b, t, HEADS, 8) for a in jnp.split(attn.c_attn(h), 3, axis=-1))
        z = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        z = fn(z) if i == layer else z
        x = x + attn.c_proj(z.reshape(b, t, c))
        x = x + block.mlp(block.ln_2(x))
    return model.head(model.ln_f(x))


def _zero_head_1(value: Any) -> Any:
    return value.at[:, :, 1].set(0.0)


def test_an_intervention_on_head_out_is_the_head_ablation(sink: Any) -> None:
    model = GPT(jax.random.key(0))
    want = jax.jit(_gpt_by_hand, static_argnums=(2, 3))(model, IDS, 1, _zero_head_1)
    plain = eqx.filter_jit(model)(IDS)
    name = "blocks.1.attn.head_out"
    change = {name: clouseau.replace(_zero_head_1)}
    fmodel = clouseau.instrument(
        model, select=[name, "blocks.1.attn_out"], path=None, intervene=change
    )
    got = fmodel(IDS)
    # The projection recomputed as the heads summed plus the bias: to rounding.
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    assert np.abs(np.asarray(got - plain)).max() > 10 * TOL
    cap = fmodel.captured  # the saved head_out is the intervened one; attn_out its sum
    assert not cap[name][:, :, 1].any()
    bias = np.asarray(model.blocks[1].attn.c_proj.bias)
    np.testing.assert_allclose(cap[name].sum(2) + bias, cap["blocks.1.attn_out"], atol=1e-5)
    same = clouseau.instrument(
        model, select="logits", path=None, intervene={"head_out": clouseau.scale(1.0)}
    )
    np.testing.assert_allclose(same(IDS), plain, rtol=0, atol=TOL)


def test_a_head_out_intervention_under_jit_vmap_and_grad(sink: Any) -> None:
    model = GqaModel(jax.random.key(0))
    name = "blocks.1.attn.head_out"
    hand = jax.jit(lambda x: _gqa_by_hand(model, x, 1, _same, False, z=_zero_head_1)[0])
    xs = jax.random.normal(jax.random.key(2), (3, 1, 6, 32))
    fm = cj.instrument(
        model, select=name, sink=sink, intervene={name: clouseau.replace(_zero_head_1)}
    )
    with fm:
        np.testing.assert_allclose(jax.jit(lambda x: fm(x))(xs[0]), hand(xs[0]), atol=TOL)
        np.testing.assert_allclose(jax.vmap(lambda x: fm(x))(xs), jax.vmap(hand)(xs), atol=TOL)
        got = jax.grad(lambda x: fm(x).sum())(xs[1])
        np.testing.assert_allclose(got, jax.grad(lambda x: hand(x).sum())(xs[1]), atol=TOL)
    for i in range(len(sink.calls)):
        if sink.calls[i]:
            assert not np.asarray(sink.values(i)[name])[..., 1, :].any()


def test_a_pattern_and_a_head_out_intervention_of_one_layer_compose() -> None:
    model = GqaModel(jax.random.key(0))
    zero_head_2 = lambda z: z.at[:, :, 2].set(0.0)  # noqa: E731
    want = jax.jit(lambda x: _gqa_by_hand(model, x, 1, _ablate_head_1, False, z=zero_head_2))
    fmodel = clouseau.instrument(
        model, select="logits", path=None,
        intervene={"blocks.1.attn.pattern": clouseau.replace(_ablate_head_1),
                   "blocks.1.attn.head_out": clouseau.replace(zero_head_2)},
    )  # fmt: skip
    np.testing.assert_allclose(fmodel(X), want(X)[0], rtol=0, atol=TOL)


def test_a_head_out_intervention_inside_the_models_scan_is_per_iteration() -> None:
    model = Steps(GqaModel(jax.random.key(0)))
    xs = jax.random.normal(jax.random.key(2), (3, 1, 6, 32))
    name = "blocks.0.attn.head_out"
    fmodel = clouseau.instrument(
        model, select=[name, "blocks.0.attn_out"], path=None,
        intervene={name: clouseau.replace(_zero_head_1)},
    )  # fmt: skip
    out = fmodel(xs)
    plain = eqx.filter_jit(model)(xs)
    assert np.abs(np.asarray(out - plain)).max() > 10 * TOL  # the change reached the outputs
    hand = jax.jit(lambda x: _gqa_by_hand(model.inner, x, 0, _same, False, z=_zero_head_1)[0])
    cap = fmodel.captured
    bias = np.asarray(model.inner.blocks[0].attn.o_proj.bias)
    for i, x in enumerate(xs):  # rewritten in every iteration, the iteration axis in front
        np.testing.assert_allclose(out[i], hand(x), rtol=0, atol=TOL)
        assert not cap[name][i][:, :, 1].any()
        heads = cap[name][i].sum(2) + bias
        np.testing.assert_allclose(heads, cap["blocks.0.attn_out"][i], rtol=0, atol=1e-5)


def test_an_intervention_on_logit_lens_changes_its_saved_value_only() -> None:
    model = GqaModel(jax.random.key(0))
    plain = eqx.filter_jit(model)(X)
    fmodel = clouseau.instrument(
        model, select=["blocks.*.logit_lens", "blocks.*.resid_post"], path=None,
        intervene={"blocks.0.logit_lens": clouseau.scale(2.0),
                   "blocks.0.resid_post": clouseau.scale(0.5)},
    )  # fmt: skip
    out = fmodel(X)
    cap = fmodel.captured
    lens = jax.jit(lambda r: model.head(model.ln_f(r)))
    # An upstream intervention reaches the later views: each lens reads its changed stream.
    np.testing.assert_allclose(
        cap["blocks.0.logit_lens"], 2 * lens(cap["blocks.0.resid_post"]), atol=1e-5
    )
    np.testing.assert_array_equal(cap["blocks.1.logit_lens"], np.asarray(out))
    assert np.abs(np.asarray(out - plain)).max() > 10 * TOL  # the resid_post change only
    only_lens = clouseau.instrument(
        model, select="blocks.0.logit_lens", path=None,
        intervene={"blocks.0.logit_lens": clouseau.zero()},
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(only_lens(X)), np.asarray(plain))
    assert not only_lens.captured["blocks.0.logit_lens"].any()


@pytest.mark.parametrize("name", ["blocks.0.logit_lens", "blocks.0.attn.head_out"])
def test_a_gradient_of_a_computed_view_is_refused(name: str) -> None:
    fmodel = clouseau.instrument(
        GqaModel(jax.random.key(0)), select="blocks.0.resid_post", path=None, grads=name
    )
    with pytest.raises(clouseau.SelectionError, match=r"never reads.*resid_post"):
        fmodel(X)


def test_scores_and_pattern_of_one_kernel_are_refused_together() -> None:
    fmodel = clouseau.instrument(
        GqaModel(jax.random.key(0)), select="resid_post", path=None,
        intervene={"blocks.0.attn.scores": clouseau.scale(0.5),
                   "blocks.0.attn.pattern": clouseau.scale(2.0)},
    )  # fmt: skip
    with pytest.raises(clouseau.SelectionError, match=r"both.*one clouseau.replace"):
        fmodel(X)
