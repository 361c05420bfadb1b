"""Derived views: the logit lens and per-head attention outputs, against the model."""

from __future__ import annotations

import pytest
import torch

import clouseau
from tests.canonical.families import BY_NAME, Family, submodule

# Where each family's attention output projection is, from a block (for its bias).
PROJECTION = {"gpt2": "attn.c_proj", "llama": "self_attn.o_proj", "gpt_neox": "attention.dense",
              "bert": "attention.output.dense"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PROJECTION))
def test_logit_lens_and_head_out(name: str) -> None:
    family: Family = BY_NAME[name]
    model = family.model()
    blocks = model.get_submodule(family.blocks[0])
    last = len(blocks) - 1
    select = ["logits", "logit_lens", "head_out", "attn_out", "resid_post"]
    fmodel = clouseau.instrument(model, select=select, path=None)
    with torch.no_grad():
        want = model(**family.inputs()).logits
        for _ in range(2):  # the first (probed) call and a lowered one
            out = fmodel(**family.inputs())
    assert torch.equal(out.logits, want)
    for call in range(2):
        cap = {
            n: torch.from_numpy(fmodel.captured.get(n, call=call)) for n in fmodel.captured.names()
        }
        assert torch.equal(cap[f"blocks.{last}.logit_lens"], want)
        for i, block in enumerate(blocks):
            lens = cap[f"blocks.{i}.logit_lens"]
            assert lens.shape == want.shape
            heads = cap[f"blocks.{i}.attn.head_out"]
            bias = submodule(block, PROJECTION[name]).bias
            bias = torch.zeros(()) if bias is None else bias.detach()
            total = heads.sum(dim=-2) + bias
            torch.testing.assert_close(total, cap[f"blocks.{i}.attn_out"], rtol=0, atol=1e-5)
        # The lens of an earlier block is the final norm and unembedding of its stream.
        if name == "gpt2":
            final = model.transformer.ln_f(cap["blocks.0.resid_post"])
            torch.testing.assert_close(
                cap["blocks.0.logit_lens"], model.lm_head(final), rtol=0, atol=1e-6
            )
