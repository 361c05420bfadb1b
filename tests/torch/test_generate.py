"""``fmodel.generate``: token-identical to ``model.generate``, one capture call per step.

Each step's saved points equal forward hooks on the same step of the model's own
``generate`` (greedy, sampling under a seed, a left-padded batch; GPT-2, Llama, T5).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import clouseau
from tests.torch.conftest import assert_same

pytestmark = pytest.mark.slow


def _gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=128,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval(), ["transformer.h.0.mlp", "transformer.h.1.mlp"]


def _llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=97, max_position_embeddings=128,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval(), ["model.layers.0.mlp", "model.layers.1.mlp"]


def _t5() -> Any:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, decoder_start_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    return T5ForConditionalGeneration(config).eval(), [
        "encoder.block.1", "decoder.block.1", "decoder.final_layer_norm",
    ]  # fmt: skip


def _gemma(version: int, attention: str = "eager") -> Any:
    """Gemma2 / Gemma3 with a sliding window of 4: layer 0 slides, layer 1 attends to all."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config, causal = {
        2: (Gemma2Config, Gemma2ForCausalLM),
        3: (Gemma3TextConfig, Gemma3ForCausalLM),
    }[version]
    config = config(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=97, max_position_embeddings=128,
        sliding_window=4, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        attn_implementation=attention,
    )  # fmt: skip
    return causal(config).eval(), ["model.layers.0", "model.layers.1.self_attn", "model.norm"]


def _hooked_generate(model: Any, paths: list[str], **kwargs: Any) -> tuple[Any, list[dict]]:
    """``model.generate`` with the outputs of ``paths`` recorded per forward step (and
    per run of an encoder-decoder's encoder, which generate runs once on its own)."""
    steps: list[dict[str, torch.Tensor]] = []
    current: dict[str, torch.Tensor] = {}

    def pre(module: Any, args: Any, kw: Any) -> None:
        current.clear()

    def post(path: str) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            value = out[0] if isinstance(out, tuple) else out
            current[path] = value.detach().clone()

        return hook

    def done(module: Any, args: Any, kw: Any, out: Any) -> None:
        steps.append(dict(current))

    roots = [model, model.get_encoder()] if model.config.is_encoder_decoder else [model]
    handles = [root.register_forward_pre_hook(pre, with_kwargs=True) for root in roots]
    handles += [model.get_submodule(p).register_forward_hook(post(p)) for p in paths]
    handles += [root.register_forward_hook(done, with_kwargs=True) for root in roots]
    try:
        out = model.generate(**kwargs)
    finally:
        for h in handles:
            h.remove()
    return out, steps


def _check(
    model: Any, paths: list[str], seed: int = 0, traces: int = 3, tolerance: float = 0.0,
    traced: bool = False, **kwargs: Any,
) -> clouseau.Capture:  # fmt: skip
    """``traced``: a selection the hook path cannot take (a callable), so every step is
    traced; else the module paths take the hook path, with no trace."""
    torch.manual_seed(seed)
    expected, steps = _hooked_generate(model, paths, **kwargs)
    select = (lambda p: p.name in paths) if traced else paths
    fmodel = clouseau.instrument(model, select=select, path=None)
    torch.manual_seed(seed)
    tokens = fmodel.generate(**kwargs)
    assert torch.equal(tokens, expected)
    cap = fmodel.captured
    assert cap.calls == tuple(range(len(steps)))  # one call per forward step, in order
    for call, step in enumerate(steps):
        for path in step:
            value = cap.get(path, call=call)
            value = value if value.ndim == step[path].ndim else value[0]
            if tolerance:
                np.testing.assert_allclose(value, step[path].numpy(), rtol=tolerance, atol=1e-9)
            else:
                assert_same(value, step[path])
    # Traced: prefill, the first decode step (static), then one dynamic export.
    assert fmodel.traces == 0 if not traced else fmodel.traces <= traces
    return cap


def _prompt(batch: int = 1, length: int = 5) -> torch.Tensor:
    return torch.randint(2, 97, (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("make", [_gpt2, _llama])
@pytest.mark.parametrize("traced", [False, True])
def test_greedy_decoding_is_token_identical(make: Any, traced: bool) -> None:
    model, paths = make()
    _check(model, paths, traced=traced, input_ids=_prompt(), max_new_tokens=12, do_sample=False)


@pytest.mark.parametrize("make", [_gpt2, _llama])
def test_sampling_under_a_seed_is_token_identical(make: Any) -> None:
    model, paths = make()
    _check(model, paths, seed=3, input_ids=_prompt(), max_new_tokens=10, do_sample=True, top_k=20)


@pytest.mark.parametrize("make", [_gpt2, _llama])
@pytest.mark.parametrize("traced", [False, True])
def test_a_left_padded_batch(make: Any, traced: bool) -> None:
    # generate passes position_ids built from the mask only to a forward whose signature
    # takes them: the traced path's step keeps the model's signature. Under export,
    # Hugging Face builds the attention mask by another path than eager (no is_causal
    # shortcut): values agree to float rounding, tokens exactly.
    model, paths = make()
    ids = _prompt(batch=3, length=6)
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 1, 0  # left padding
    ids[2, :4], mask[2, :4] = 1, 0
    _check(
        model, paths, tolerance=1e-4 if traced else 0.0, traced=traced,
        input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
    )  # fmt: skip


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("length", [2, 6])  # shorter than the window, then longer
def test_gemma_sliding_window_cache_takes_three_exports(version: int, length: int) -> None:
    # The sliding layer's cache counter (cumulative_length) is an input of the graph, not
    # part of the structure: the prefill, the first decode step (static), then one dynamic
    # export for every later step, as for GPT-2; every step's points bitwise as eager.
    # A prompt shorter than the window takes one export more: the sliding layer's Python
    # branch on a full window (``cumulative_length >= sliding_window``) flips once.
    model, paths = _gemma(version)
    _check(
        model, paths, traced=True, traces=3 if length >= 4 else 4,
        input_ids=_prompt(length=length), max_new_tokens=12, do_sample=False,
    )  # fmt: skip


@pytest.mark.parametrize("length", [2, 6])
def test_gemma3_sdpa_steps_differ_from_eager_only_by_gqa_packing(
    monkeypatch: pytest.MonkeyPatch, length: int
) -> None:
    # Why Gemma3's SDPA decode steps differ from eager in the last bits: with one query
    # token and grouped KV heads, eager transformers packs the query heads of a group into
    # the query length (pack_gqa: one SDPA call against the unrepeated keys) unless
    # TorchDynamo compiles; under torch.export it repeats the keys instead (repeat_kv).
    # Equal math, other reduction shapes, other rounding. With the eager run taking
    # export's branch too, every step is bitwise equal to the traced one; the plain eager
    # run agrees within float32 rounding (the documented bound) and in every token.
    from transformers.integrations import sdpa_attention

    model, paths = _gemma(3, "sdpa")
    kwargs = {"input_ids": _prompt(length=length), "max_new_tokens": 12, "do_sample": False}
    plain, plain_steps = _hooked_generate(model, paths, **kwargs)
    monkeypatch.setattr(sdpa_attention, "is_torchdynamo_compiling", lambda: True)
    cap = _check(model, paths, traced=True, traces=3 if length >= 4 else 4, **kwargs)
    repeated, _ = _hooked_generate(model, paths, **kwargs)
    assert torch.equal(repeated, plain)
    assert len(plain_steps) == len(cap.calls)
    for call, step in enumerate(plain_steps):
        for path, expected in step.items():
            np.testing.assert_allclose(
                cap.get(path, call=call), expected.numpy(), rtol=1e-5, atol=1e-6
            )


def test_t5_encoder_decoder_generation() -> None:
    model, paths = _t5()
    # Call 0 is the encoder's run (generate runs it once, on its own), then one call per
    # decoder step; with module paths selected, no trace at all.
    cap = _check(model, paths, input_ids=_prompt(batch=2), max_new_tokens=8, do_sample=False)
    assert cap.get("encoder.block.1", call=0).shape[:2] == (2, 5)
    assert cap.get("decoder.block.1", call=1).shape[:2] == (2, 1)


def test_t5_traced_selection() -> None:
    model, paths = _t5()
    # A callable takes the traced path: the encoder run is call 0 there too, its points
    # named as in the whole model; the decoder steps share traces (the first step, the
    # second, then one dynamic export for every later step) beside the encoder's one.
    cap = _check(
        model, paths, traced=True, traces=4,
        input_ids=_prompt(batch=2), max_new_tokens=8, do_sample=False,
    )  # fmt: skip
    assert cap.calls == tuple(range(1 + 8))
    assert cap.get("encoder.block.1", call=0).shape[:2] == (2, 5)


def test_t5_op_globs_pick_encoder_and_decoder_points() -> None:
    model, paths = _t5()
    kwargs = {"input_ids": _prompt(batch=2), "max_new_tokens": 6, "do_sample": False}
    expected, steps = _hooked_generate(model, paths, **kwargs)
    fmodel = clouseau.instrument(
        model, select=["*.scaled_dot_product_attention", *paths], path=None
    )
    assert torch.equal(fmodel.generate(**kwargs), expected)
    cap = fmodel.captured
    assert cap.calls == tuple(range(len(steps)))
    for call, step in enumerate(steps):
        for path in step:
            assert_same(cap.get(path, call=call), step[path])
    attention = "block.1.layer.0.SelfAttention.scaled_dot_product_attention"
    assert cap.calls_of("encoder." + attention) == (0,)
    assert cap.calls_of("decoder." + attention) == tuple(range(1, len(steps)))
    assert fmodel.traces <= 4


def test_t5_a_decoder_only_selection_keeps_the_encoder_call() -> None:
    # The encoder run saves nothing, yet it is call 0: decoder step k is call k + 1,
    # as on the hook path.
    model, _ = _t5()
    kwargs = {"input_ids": _prompt(batch=1), "max_new_tokens": 4, "do_sample": False}
    fmodel = clouseau.instrument(model, select="decoder.*.scaled_dot_product_attention", path=None)
    fmodel.generate(**kwargs)
    assert fmodel.captured.calls == (1, 2, 3, 4)


def test_t5_interventions_on_the_encoder_and_the_decoder() -> None:
    # Each pattern picks points of one side only; both apply, as forward hooks would.
    model, paths = _t5()
    changed = ["encoder.block.0.layer.0.SelfAttention.o", "decoder.block.1.layer.0.SelfAttention.o"]
    handles = [
        model.get_submodule(p).register_forward_hook(lambda m, a, out: out * 0.5) for p in changed
    ]
    kwargs = {"input_ids": _prompt(batch=2), "max_new_tokens": 5, "do_sample": False}
    try:
        expected, steps = _hooked_generate(model, paths, **kwargs)
    finally:
        for h in handles:
            h.remove()
    fmodel = clouseau.instrument(
        model, select=lambda p: p.name in paths, path=None,
        intervene={p: clouseau.scale(0.5) for p in changed},
    )  # fmt: skip
    assert torch.equal(fmodel.generate(**kwargs), expected)
    for call, step in enumerate(steps):
        for path in step:
            assert_same(fmodel.captured.get(path, call=call), step[path])


def test_t5_a_glob_matching_nowhere_is_an_error() -> None:
    model, _ = _t5()
    fmodel = clouseau.instrument(model, select="*.softmax", path=None)
    with pytest.raises(clouseau.SelectionError, match=r"'\*\.softmax' matched no point"):
        fmodel.generate(input_ids=_prompt(), max_new_tokens=2, do_sample=False)


def test_generate_needs_a_generation_model() -> None:
    fmodel = clouseau.instrument(torch.nn.Linear(2, 2), select="*", path=None)
    with pytest.raises(AttributeError, match="has no generate"):
        fmodel.generate(torch.ones(1, 2))
