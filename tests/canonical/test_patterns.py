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
    names = set(fmodel.captured.graph.names())
    for name in want:
        base = name.rsplit(".", 1)[0]
        assert {f"{base}.{leaf}" for leaf in ATTN} <= names, sorted(names)


@pytest.mark.parametrize(
    "family", [f for f in FUSED if f.name in ("gpt2", "falcon")], ids=lambda f: f.name
)
def test_heads_last_layouts_are_the_kernels_values(family: Family) -> None:
    model = family.model("sdpa")
    fmodel = clouseau.instrument(model, select=[f"blocks.0.attn.{x}" for x in ATTN], path=None)
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


def test_patterns_and_logit_lens_in_generate() -> None:
    family = next(f for f in FUSED if f.name == "llama")
    model = family.model("sdpa")
    ids = family.inputs()["input_ids"]
    eager = family.model("eager")
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        want = eager.generate(
            ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
            output_attentions=True, output_logits=True,
        )  # fmt: skip
        plain = model.generate(ids, max_new_tokens=3, do_sample=False)
    fmodel = clouseau.instrument(model, select=["pattern", "logit_lens"], path=None)
    with torch.no_grad():
        got = fmodel.generate(ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(got, plain) and torch.equal(got, want.sequences)
    cap = fmodel.captured
    for step, weights in enumerate(want.attentions):
        for i, w in enumerate(weights):
            pattern = torch.from_numpy(cap.get(f"blocks.{i}.attn.pattern", call=step))
            torch.testing.assert_close(pattern, w, rtol=0, atol=1e-6)
        lens = torch.from_numpy(cap.get(f"blocks.{len(weights) - 1}.logit_lens", call=step))
        torch.testing.assert_close(lens[:, -1], want.logits[step], rtol=0, atol=1e-5)


def test_t5_generation_steps_keep_decoder_names() -> None:
    family = next(f for f in FUSED if f.name == "t5")
    model = family.model("sdpa")
    fmodel = clouseau.instrument(model, select=["decoder.blocks.*.cross_attn.pattern"], path=None)
    with torch.no_grad():
        out = fmodel.generate(family.inputs()["input_ids"], max_new_tokens=2, do_sample=False)
        plain = model.generate(family.inputs()["input_ids"], max_new_tokens=2, do_sample=False)
    assert torch.equal(out, plain)
    cap = fmodel.captured
    name = "decoder.blocks.1.cross_attn.pattern"
    steps = [c for c in cap.calls if cap.get(name, call=c) is not None]
    assert len(steps) == 2  # one per decoder step; the encoder's own run has no decoder
    for call in steps:
        pattern = cap.get(name, call=call)
        assert pattern.shape[-1] == family.inputs()["input_ids"].shape[-1]
        assert abs(pattern.sum(-1) - 1).max() < 1e-5


@pytest.mark.parametrize("family", [f for f in FAMILIES if not f.fused], ids=lambda f: f.name)
def test_families_without_sdpa_have_their_own_softmax_as_pattern(family: Family) -> None:
    # transformers 5.24 refuses SDPA for them (Gemma2: logit softcapping, Bloom: ALiBi in
    # its own baddbmm): docs/canonical.md says so; their pattern is the model's softmax.
    with pytest.raises(ValueError, match="does not support an attention implementation"):
        family.build("sdpa")
    model = family.model("eager")
    with torch.no_grad():
        want = model(**family.inputs(), output_attentions=True).attentions
    fmodel = clouseau.instrument(model, select=["pattern", "scores"], path=None)
    with torch.no_grad():
        fmodel(**family.inputs())
    cap = fmodel.captured
    for i, weights in enumerate(want):
        name = f"blocks.{i}.attn.pattern"
        assert cap.graph.node(cap.graph.point(name).ref.node).op != "computed"
        assert torch.equal(torch.from_numpy(cap[name]), weights)
        scores = torch.from_numpy(cap[f"blocks.{i}.attn.scores"])
        torch.testing.assert_close(torch.softmax(scores, -1), weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_scores_and_pattern_together_compute_scores_once(family: str) -> None:
    from clouseau.capture.torch.lowering.computed import COMPUTED_META, MATMULS
    from clouseau.capture.torch.lowering.lower import lower

    fam = next(f for f in FUSED if f.name == family)
    model = fam.model("sdpa")
    want = _eager_weights(model, fam)
    lowered = lower(model, (), fam.inputs(), ["blocks.*.attn.scores", "blocks.*.attn.pattern"])
    computed = [n for n in lowered.module.graph.nodes if n.meta.get(COMPUTED_META)]
    # One q @ k^T and one softmax per attention: the pattern is the scores' softmax.
    assert sum(n.target in MATMULS for n in computed) == len(want)
    fmodel = clouseau.instrument(model, select=["scores", "pattern"], path=None)
    for call in range(2):
        with torch.no_grad():
            fmodel(**fam.inputs())
        for name, weights in want.items():
            got = torch.from_numpy(fmodel.captured.get(name, call=call))
            torch.testing.assert_close(got, weights, rtol=0, atol=1e-6)
            scores = fmodel.captured.get(name.replace("pattern", "scores"), call=call)
            torch.testing.assert_close(
                torch.softmax(torch.from_numpy(scores), -1), got, rtol=0, atol=1e-6
            )
