"""Canonical residual-stream names on many transformer families, against forward hooks."""

from __future__ import annotations

import pytest
import torch

import clouseau
from tests.canonical.families import FAMILIES, Family, hooked
from tests.models.helpers import check_model

GLOBS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "mlp.pre", "mlp.post")


def _n_blocks(model: torch.nn.Module, family: Family) -> list[tuple[str, int]]:
    return [
        (prefix, len(model.get_submodule(path)))
        for prefix, path in zip(family.prefixes, family.blocks, strict=True)
    ]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_residual_stream_names_equal_hooks(family: Family) -> None:
    model = family.model()
    want = hooked(model, family)
    expected = {"logits"} if family.logits else set()
    for prefix, count in _n_blocks(model, family):
        expected |= {prefix + "embed"} | ({prefix + "ln_final"} if family.ln_final else set())
        expected |= {prefix + "pos_embed"} if family.pos_embed else set()
        for i in range(count):
            base = f"{prefix}blocks.{i}"
            leaves = [g for g in GLOBS if family.kind != "parallel" or g != "resid_mid"]
            expected |= {f"{base}.{leaf}" for leaf in leaves}
    selected = sorted(
        n for n in expected if not n.endswith(("embed", "ln_final", "mlp.pre", "mlp.post"))
    )
    fmodel = clouseau.instrument(model, select=selected, path=None)
    with torch.no_grad():
        out = fmodel(**family.inputs())
    names = set(fmodel.captured.graph.names())
    assert expected <= names, sorted(expected - names)
    # TransformerLens' spelling names the same values.
    assert {"blocks.0.hook_resid_pre", "blocks.1.hook_resid_post"} <= names or family.prefixes != (
        "",
    )
    got = {name: torch.from_numpy(fmodel.captured[name]) for name in selected}
    for name in selected:
        if name in want:
            assert torch.equal(got[name], want[name]), name
    if family.logits:
        assert torch.equal(torch.as_tensor(got["logits"]), want["logits"])
        assert torch.equal(out.logits, want["logits"])
    for prefix, count in _n_blocks(model, family):
        for i in range(count):
            b = f"{prefix}blocks.{i}."
            pre, post = got[b + "resid_pre"], got[b + "resid_post"]
            # OPT flattens batch and position around its MLP: one stream, two layouts.
            attn = got[b + "attn_out"].reshape(pre.shape)
            mlp = got[b + "mlp_out"].reshape(pre.shape)
            if family.kind == "parallel":
                torch.testing.assert_close(post, pre + attn + mlp, rtol=0, atol=1e-5)
            elif family.kind == "seq" and not prefix.startswith("decoder"):
                mid = got[b + "resid_mid"].reshape(pre.shape)
                assert torch.equal(mid, pre + attn)
                assert torch.equal(post, mid + mlp)
            elif family.kind == "post":
                ln = torch.nn.functional.layer_norm
                block = model.get_submodule(family.blocks[0])[i]
                norm = block.attention.output.LayerNorm
                mid = ln(pre + attn, (32,), norm.weight, norm.bias, norm.eps)
                torch.testing.assert_close(got[b + "resid_mid"], mid, rtol=0, atol=1e-6)


def test_convits_positional_softmax_is_no_attention() -> None:
    """ConViT's gated positional attention: a softmax of a buffer expanded to the batch (no
    model input reaches it) is no eager attention; the capture equals forward hooks."""
    timm = pytest.importorskip("timm")
    model = timm.create_model(
        "convit_tiny", pretrained=False, img_size=32, patch_size=8, depth=2,
        local_up_to_layer=1, num_classes=10,
    ).eval()  # fmt: skip
    check_model(model, torch.randn(1, 3, 32, 32))
