"""Attention patterns computed beside a fused kernel equal the eager attention's weights."""

from __future__ import annotations

import pytest
import torch

import clouseau
from tests.canonical.families import FAMILIES, Family, first_tensor

FUSED = [f for f in FAMILIES if f.fused]
ATTN = ("q", "k", "v", "scores", "pattern", "z")


def _eager_weights(model: torch.nn.Module, family: Family) -> dict[str, torch.Tensor]:
    # The same weights in a model built for eager attention (some families, Falcon, choose
    # their attention classes when built).
    eager = family.model("eager")
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        out = eager(**family.inputs(), output_attentions=True)
    found: dict[str, torch.Tensor] = {}
    if family.prefixes == ("",):
        groups = {"blocks.{}.attn.pattern": out.attentions}
    else:  # encoder-decoder
        groups = {
            "encoder.blocks.{}.attn.pattern": out.encoder_attentions,
            "decoder.blocks.{}.attn.pattern": out.decoder_attentions,
            "decoder.blocks.{}.cross_attn.pattern": out.cross_attentions,
        }
    for spelling, weights in groups.items():
        for i, w in enumerate(weights):
            found[spelling.format(i)] = w
    return found


@pytest.mark.parametrize("family", FUSED, ids=lambda f: f.name)
def test_pattern_beside_sdpa_equals_eager_weights(family: Family) -> None:
    model = family.model("sdpa")
    want = _eager_weights(model, family)
    names = set(clouseau.trace(model, **family.inputs()).names())
    for name in want:
        base = name.rsplit(".", 1)[0]
        assert {f"{base}.{leaf}" for leaf in ATTN} <= names, sorted(names)
    with torch.no_grad():
        expected = first_tensor(model(**family.inputs()))
    fmodel = clouseau.instrument(model, select=sorted(want), path=None)
    for call in range(2):  # the first (probed) call and a lowered one
        with torch.no_grad():
            out = first_tensor(fmodel(**family.inputs()))
        assert torch.equal(out, expected)  # the model's outputs stay bitwise
        for name, weights in want.items():
            got = torch.from_numpy(fmodel.captured.get(name, call=call))
            torch.testing.assert_close(got, weights, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "family", [f for f in FUSED if f.name in ("gpt2", "falcon")], ids=lambda f: f.name
)
def test_heads_last_layouts_are_the_kernels_values(family: Family) -> None:
    model = family.model("sdpa")
    fmodel = clouseau.instrument(model, select=["blocks.0.attn.*"], path=None)
    with torch.no_grad():
        fmodel(**family.inputs())
    cap = fmodel.captured
    q, k, v, z = (torch.from_numpy(cap[f"blocks.0.attn.{x}"]) for x in "qkvz")
    pattern = torch.from_numpy(cap["blocks.0.attn.pattern"])
    heads = pattern.shape[1]
    v = v.repeat_interleave(heads // v.shape[2], dim=2)
    # z is the pattern applied to v, per head.
    torch.testing.assert_close(z, torch.einsum("bhqk,bkhd->bqhd", pattern, v), rtol=0, atol=1e-5)
    assert q.shape[2] == heads and k.shape[-1] == q.shape[-1]
