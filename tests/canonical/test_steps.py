"""Computed points (patterns beside SDPA, the logit lens, per-head outputs) in
``generate`` and ``record``: every step and every batch equal to eager values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import clouseau
from tests.canonical.families import BY_NAME, IDS, first_tensor

GPT2 = BY_NAME["gpt2"]
LAYERS = 2


def _resid_posts(model: torch.nn.Module, run) -> list[list[torch.Tensor]]:
    """Each block's output, per forward call of ``run()`` (one per generation step)."""
    seen: list[list[torch.Tensor]] = [[] for _ in range(LAYERS)]
    _run_hooked(
        [
            block.register_forward_hook(lambda m, a, out, i=i: seen[i].append(first_tensor(out)))
            for i, block in enumerate(model.transformer.h)
        ],
        run,
    )
    return seen


def _run_hooked(handles: list[torch.utils.hooks.RemovableHandle], run) -> None:
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()


def _lens(model: torch.nn.Module, resid: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.lm_head(model.transformer.ln_f(resid))


def test_generate_captures_patterns_and_logit_lens_at_every_step() -> None:
    model = GPT2.model("sdpa")
    eager = GPT2.model("eager")
    eager.load_state_dict(model.state_dict())
    kw = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    out: dict[str, object] = {}

    def run_eager() -> None:
        out["want"] = eager.generate(
            IDS, **kw, return_dict_in_generate=True, output_attentions=True
        )

    resid = _resid_posts(eager, run_eager)
    want = out["want"]
    fmodel = clouseau.instrument(
        model, select=["blocks.*.attn.pattern", "blocks.*.logit_lens"], path=None
    )
    with torch.no_grad():
        got = fmodel.generate(IDS, **kw)
    assert torch.equal(got, want.sequences)
    cap = fmodel.captured
    assert len(cap.calls) == len(want.attentions) == 3
    for step, weights in zip(cap.calls, want.attentions, strict=True):
        for i, w in enumerate(weights):
            pattern = torch.from_numpy(cap.get(f"blocks.{i}.attn.pattern", call=step))
            torch.testing.assert_close(pattern, w, rtol=0, atol=1e-6)
            # generate asks for the last position's logits only: so does the lens.
            lens = torch.from_numpy(cap.get(f"blocks.{i}.logit_lens", call=step))
            hand = _lens(eager, resid[i][step][:, -1:])
            torch.testing.assert_close(lens, hand, rtol=0, atol=1e-5)


def _head_outs(model: torch.nn.Module, run) -> list[torch.Tensor]:
    """Per block: each head's z through its rows of GPT-2's ``c_proj`` (a ``Conv1D``)."""
    found: list[torch.Tensor] = []

    def hook(proj, args) -> None:
        heads = model.config.n_head
        per = args[0].unflatten(-1, (heads, -1))  # [batch, pos, head, d_head]
        w = proj.weight.unflatten(0, (heads, -1))  # [head, d_head, d_model]
        found.append(torch.einsum("bphd,hdm->bphm", per, w))

    _run_hooked([b.attn.c_proj.register_forward_pre_hook(hook) for b in model.transformer.h], run)
    return found


def test_record_writes_computed_points_equal_to_eager(tmp_path: Path) -> None:
    model = GPT2.model("sdpa")
    eager = GPT2.model("eager")
    eager.load_state_dict(model.state_dict())
    batches = [{"input_ids": IDS}, {"input_ids": torch.flip(IDS, (1,)).repeat(2, 1)}]
    select = ["blocks.*.attn.pattern", "blocks.*.logit_lens", "blocks.*.attn.head_out"]
    cap = clouseau.record(model, batches, select=select, path=tmp_path / "acts", progress=False)
    assert cap.calls == (0, 1)
    for call, batch in enumerate(batches):
        out: dict[str, object] = {}

        def run(batch=batch, out=out) -> None:
            out["eager"] = eager(**batch, output_attentions=True)

        heads = _head_outs(eager, run)
        resid = _resid_posts(eager, lambda batch=batch: eager(**batch))
        for i in range(LAYERS):
            pattern = cap.get(f"blocks.{i}.attn.pattern", call=call)
            np.testing.assert_allclose(pattern, out["eager"].attentions[i], rtol=0, atol=1e-6)
            lens = cap.get(f"blocks.{i}.logit_lens", call=call)
            np.testing.assert_allclose(lens, _lens(eager, resid[i][0]), rtol=0, atol=1e-5)
            head_out = cap.get(f"blocks.{i}.attn.head_out", call=call)
            np.testing.assert_allclose(head_out, heads[i], rtol=0, atol=1e-5)
