"""Computed points on JAX: the logit lens, per-head outputs and jax's fused attention's
patterns, on Equinox and Flax NNX transformers, against ``jax.jit`` of the same
computation by hand; under the user's ``jit``, ``vmap``, ``grad`` and ``lax.scan``."""

from __future__ import annotations

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

IDS = jnp.array([[1, 2, 3, 4, 5, 6]])
VIEWS = ["blocks.*.resid_post", "blocks.*.logit_lens", "blocks.*.attn.head_out",
         "blocks.*.attn.z", "blocks.*.attn_out", "logits"]  # fmt: skip


def _check_views(cap: dict[str, np.ndarray], out: Any, unembed: Any, bias: list[Any]) -> None:
    """The lens is ``unembed`` of each stream (the logits at the last block, bit for bit);
    a block's heads summed, plus its projection's bias, are its ``attn_out``."""
    lens = jax.jit(unembed)
    for i, b in enumerate(bias):
        want = lens(cap[f"blocks.{i}.resid_post"])
        np.testing.assert_allclose(cap[f"blocks.{i}.logit_lens"], want, rtol=0, atol=1e-5)
        heads = cap[f"blocks.{i}.attn.head_out"]
        assert heads.shape == (*cap[f"blocks.{i}.attn_out"].shape[:2], HEADS, 32)
        summed = heads.sum(axis=2) + np.asarray(b)
        np.testing.assert_allclose(summed, cap[f"blocks.{i}.attn_out"], rtol=0, atol=1e-5)
    last = len(bias) - 1
    np.testing.assert_array_equal(cap[f"blocks.{last}.logit_lens"], np.asarray(out))
    np.testing.assert_array_equal(cap["logits"], np.asarray(out))


def test_equinox_logit_lens_and_head_out() -> None:
    model = GPT(jax.random.key(0))
    fmodel = clouseau.instrument(model, select=VIEWS, path=None)
    out = fmodel(IDS)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(eqx.filter_jit(model)(IDS)))
    cap = fmodel.captured
    _check_views(
        cap, out, lambda r: model.head(model.ln_f(r)), [b.attn.c_proj.bias for b in model.blocks]
    )
    # One head's share by hand: its z through its rows of the output projection.
    block = model.blocks[0]
    z = cap["blocks.0.attn.z"]  # [batch, pos, head, d_head]
    w = block.attn.c_proj.weight.reshape(32, HEADS, 8)  # [d_model, head, d_head]
    want = jax.jit(lambda z: jnp.einsum("bphd,mhd->bphm", z, w))(z)
    np.testing.assert_allclose(cap["blocks.0.attn.head_out"], want, rtol=0, atol=1e-5)


def _nnx_by_hand(model: NnxGPT, ids: jax.Array) -> dict[str, Any]:
    """Every canonical value of the NNX model, its submodules called on the same inputs."""
    found: dict[str, Any] = {}
    found["embed"] = model.wte(ids)
    found["pos_embed"] = model.wpe(jnp.cumsum(ids >= 0, axis=-1) - 1)
    x = found["embed"] + found["pos_embed"]
    mask = nnx.make_causal_mask(ids)
    for i, block in enumerate(model.blocks):
        base = f"blocks.{i}"
        found[f"{base}.resid_pre"] = x
        h = block.ln_1(x)
        q, k, v = block.attn.query(h), block.attn.key(h), block.attn.value(h)
        found[f"{base}.attn.q"], found[f"{base}.attn.k"], found[f"{base}.attn.v"] = q, k, v
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
        found[f"{base}.attn.scores"] = scores = jnp.where(mask, scores, -jnp.inf)
        found[f"{base}.attn.pattern"] = pattern = jax.nn.softmax(scores, axis=-1)
        found[f"{base}.attn.z"] = z = jnp.einsum("bhqk,bkhd->bqhd", pattern, v)
        found[f"{base}.attn_out"] = attn = block.attn.out(z)
        found[f"{base}.resid_mid"] = mid = x + attn
        found[f"{base}.mlp.pre"] = pre = block.up(block.ln_2(mid))
        found[f"{base}.mlp.post"] = post = nnx.gelu(pre)
        found[f"{base}.mlp_out"] = mlp = block.down(post)
        found[f"{base}.resid_post"] = x = mid + mlp
    found["ln_final"] = model.ln_f(x)
    found["logits"] = model.head(found["ln_final"])
    return found


def test_nnx_transformer_gets_canonical_names() -> None:
    model = NnxGPT(nnx.Rngs(0))
    want = {n: np.asarray(v) for n, v in nnx.jit(_nnx_by_hand)(model, IDS).items()}
    names = set(clouseau.trace(model, IDS).names())
    views = {f"blocks.{i}.{v}" for i in range(2) for v in ("logit_lens", "attn.head_out")}
    assert set(want) | views <= names, sorted((set(want) | views) - names)
    assert {"blocks.0.attn.hook_pattern", "blocks.1.hook_resid_post", "hook_embed"} <= names
    fmodel = clouseau.instrument(model, select=sorted(want) + VIEWS, path=None)
    out = fmodel(IDS)
    np.testing.assert_array_equal(
        np.asarray(out), np.asarray(nnx.jit(lambda m, a: m(a))(model, IDS))
    )
    cap = fmodel.captured
    for name, value in want.items():
        tol = 1e-6 if name.endswith(("pattern", "scores")) else 1e-5
        np.testing.assert_allclose(cap[name], value, rtol=0, atol=tol, err_msg=name)
    _check_views(
        cap, out, lambda r: model.head(model.ln_f(r)), [b.attn.out.bias for b in model.blocks]
    )


def _gqa_patterns(model: GqaModel, x: jax.Array) -> dict[str, Any]:
    """Both blocks' scores and patterns written out: repeated key heads, bias or mask."""
    found: dict[str, Any] = {}
    t = x.shape[-2]
    pos = jnp.arange(t)
    alibi = -0.5 * jnp.abs(pos[:, None] - pos[None, :]) * jnp.arange(1, HEADS + 1)[:, None, None]
    keep = jnp.tril(jnp.ones((t, t), bool)) & (pos < t - 1)[None, :]
    for i, block in enumerate(model.blocks):
        attn, h = block.attn, block.ln_1(x)
        q = attn.q_proj(h).reshape(1, t, HEADS, 8)
        k = jnp.split(attn.kv_proj(h), 2, -1)[0].reshape(1, t, 2, 8)
        k = jnp.repeat(k, HEADS // 2, axis=2)  # query head n reads key head n // 2
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        scores = (
            scores * 0.3 + alibi if i == 0 else jnp.where(keep, scores / jnp.sqrt(8.0), -jnp.inf)
        )
        found[f"blocks.{i}.attn.scores"] = scores
        found[f"blocks.{i}.attn.pattern"] = jax.nn.softmax(scores, axis=-1)
        x = block(x, alibi[None] if i == 0 else jnp.broadcast_to(keep[None, None], (1, 1, t, t)))
    return found


X = jax.random.normal(jax.random.key(1), (1, 6, 32))


def test_fused_attention_patterns_grouped_query_bias_and_mask() -> None:
    model = GqaModel(jax.random.key(0))
    graph = clouseau.trace(model, X)
    kernels = [n for n in graph.nodes if n.op == "dot_product_attention"]
    assert [n.attr("is_causal") for n in kernels] == [False, True]
    want = jax.jit(_gqa_patterns)(model, X)
    fmodel = clouseau.instrument(model, select=["scores", "pattern"], path=None)
    out = fmodel(X)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(eqx.filter_jit(model)(X)))
    cap = fmodel.captured
    for name, value in want.items():
        np.testing.assert_allclose(cap[name], value, rtol=0, atol=1e-6, err_msg=name)
    # The kernel's own ops stay points: selecting "*softmax*" saves them, as before.
    inner = clouseau.instrument(model, select="*dot_product_attention.softmax", path=None)
    inner(X)
    assert len(inner.captured) == 2


def test_computed_points_under_jit_vmap_grad_and_scan(sink: Any) -> None:
    model = GqaModel(jax.random.key(0))
    select = ["blocks.*.attn.pattern", "blocks.*.logit_lens", "blocks.*.attn.head_out"]
    direct = clouseau.instrument(model, select=select, path=None)
    xs = jax.random.normal(jax.random.key(2), (3, 1, 6, 32))
    for x in xs:
        direct(x)
    # captured stacks the calls: one value per example
    want = [{n: v[i] for n, v in direct.captured.items()} for i in range(len(xs))]
    fm = cj.instrument(model, select=select, sink=sink)
    with fm:
        jax.jit(lambda x: fm(x))(xs[0])
        jax.vmap(lambda x: fm(x))(xs)
        jax.grad(lambda x: fm(x).sum())(xs[1])
        jax.lax.scan(lambda c, x: (c, fm(x)), 0.0, xs)
    calls = [sink.values(i) for i in range(len(sink.calls)) if sink.calls[i]]
    assert len(calls) == 1 + 1 + 1 + 3
    by_call = [want[0], None, want[1], *want]
    for got, expect in zip(calls, by_call, strict=True):
        for name in want[0]:
            # vmap: one call, the batch axis in front
            value = np.stack([w[name] for w in want]) if expect is None else expect[name]
            np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-6, err_msg=name)


def test_exporting_a_computed_point_to_onnx_is_refused(tmp_path: Any) -> None:
    pytest.importorskip("onnx")
    from clouseau.exporters.onnx_jax import UnsupportedOpError

    model = GqaModel(jax.random.key(0))
    with pytest.raises(UnsupportedOpError, match=r"blocks\.0\.logit_lens.*computed point"):
        clouseau.export_onnx(model, (X,), tmp_path / "m.onnx", select="blocks.0.logit_lens")


class Steps(eqx.Module):
    """The model called in the body of its own ``lax.scan``, once per step."""

    inner: GqaModel

    def __call__(self, xs: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, x: (c, self.inner(x)), 0.0, xs)[1]


def test_computed_points_inside_the_models_scan_are_per_iteration() -> None:
    model = Steps(GqaModel(jax.random.key(0)))
    xs = jax.random.normal(jax.random.key(2), (3, 1, 6, 32))
    select = ["blocks.*.attn.pattern", "blocks.*.logit_lens"]
    fmodel = clouseau.instrument(model, select=select, path=None)
    out = fmodel(xs)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(eqx.filter_jit(model)(xs)))
    cap = fmodel.captured
    hand = jax.jit(_gqa_patterns)
    for i, x in enumerate(xs):  # one value per iteration, the iteration axis in front
        want = hand(model.inner, x)
        for b in range(2):
            name = f"blocks.{b}.attn.pattern"
            np.testing.assert_allclose(cap[name][i], want[name], rtol=0, atol=1e-6)
        np.testing.assert_allclose(cap["blocks.1.logit_lens"][i], out[i], rtol=0, atol=1e-6)
