"""Hugging Face models, built from small configs and called as their docs call them.

Default configs otherwise (``use_cache=True``): the returned cache is compared too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import clouseau
from clouseau.ir.graph import TraceKind
from tests.models.helpers import assert_equal, check_model, tensors_of

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[5, 17, 42, 8, 99, 3, 61]])
SMALL = {"vocab_size": 100, "max_position_embeddings": 32}
DECODER = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
           "num_key_value_heads": 1, "intermediate_size": 64, **SMALL}  # fmt: skip


def gpt2() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    return transformers.GPT2LMHeadModel(config), (IDS,), {}


def bert() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, **SMALL
    )
    mask = torch.ones_like(IDS)
    return transformers.BertModel(config), (IDS,), {"attention_mask": mask}


def llama() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER)), (IDS,), {}


def mistral() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    return transformers.MistralForCausalLM(transformers.MistralConfig(**DECODER)), (IDS,), {}


def mixtral() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    config = transformers.MixtralConfig(**DECODER, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config), (IDS,), {}


def t5() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    config = transformers.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=32, d_kv=8, num_heads=2, d_ff=64,
        vocab_size=100,
    )  # fmt: skip
    return (
        transformers.T5ForConditionalGeneration(config),
        (IDS,),
        {"decoder_input_ids": IDS[:, :3]},
    )


def vit() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    config = transformers.ViTConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        image_size=16, patch_size=8,
    )  # fmt: skip
    return transformers.ViTModel(config), (torch.randn(1, 3, 16, 16),), {}


def gemma() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    config = transformers.GemmaConfig(**DECODER, head_dim=16)
    return transformers.GemmaForCausalLM(config), (IDS,), {}


def whisper() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    config = transformers.WhisperConfig(
        vocab_size=100, num_mel_bins=8, encoder_layers=1, decoder_layers=1, d_model=32,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
        decoder_start_token_id=1, pad_token_id=0,
    )  # fmt: skip
    features = torch.randn(1, 8, 32)  # (batch, mel bins, 2 * max_source_positions frames)
    return (
        transformers.WhisperForConditionalGeneration(config),
        (features,),
        {"decoder_input_ids": IDS[:, :3]},
    )


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]]] = {
    "gpt2": gpt2, "bert": bert, "llama": llama, "mistral": mistral, "mixtral": mixtral,
    "t5": t5, "vit": vit, "gemma": gemma, "whisper": whisper,
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_every_module_output_equals_a_forward_hook(name: str) -> None:
    transformers.logging.set_verbosity_error()
    model, args, kwargs = MODELS[name]()
    graph = check_model(model.eval(), *args, **kwargs)
    assert graph.trace_kind in (TraceKind.TORCH_FX, TraceKind.TORCH_EXPORT)


def test_gpt2_names_each_layer_norm_by_its_own_path() -> None:
    # The issue's case: ln_1 held ln_2's output. A hook on each says which is which.
    transformers.logging.set_verbosity_error()
    model, args, _ = gpt2()
    model.eval()
    reference = copy.deepcopy(model)  # hooked: the export path calls no submodule
    seen: dict[str, torch.Tensor] = {}
    block = reference.transformer.h[0]
    for name in ("ln_1", "ln_2"):
        getattr(block, name).register_forward_hook(
            lambda m, a, out, name=name: seen.__setitem__(name, out.detach().clone())
        )
    fmodel = clouseau.instrument(model, select="transformer.h.0.ln_*", path=None)
    with torch.no_grad():
        reference(*args)
        fmodel(*args)
    captured = fmodel.captured
    assert_equal(captured["transformer.h.0.ln_1"], seen["ln_1"], "ln_1")
    assert_equal(captured["transformer.h.0.ln_2"], seen["ln_2"], "ln_2")
    # GPT-2's wpe is fed by positions computed from no input: a point all the same.
    assert "transformer.wpe" in captured.graph.names()


def test_a_cache_passed_in_grows_in_place_and_outputs_equal_eager() -> None:
    transformers.logging.set_verbosity_error()
    model, _, _ = llama()
    model.eval()

    def run(m: torch.nn.Module) -> list[Any]:
        cache = transformers.DynamicCache(config=model.config)
        outs = []
        with torch.no_grad():
            for step in (IDS, IDS[:, :1], IDS[:, 1:2]):
                out = m(step, past_key_values=cache)
                assert out.past_key_values is cache
                outs.append(copy.deepcopy(out))
        return outs

    expected = run(model)
    fmodel = clouseau.instrument(model, select="model.layers.*.self_attn:0", path=None)
    for actual, want in zip(run(fmodel), expected, strict=True):
        got, ref = tensors_of(actual), tensors_of(want)
        assert len(got) == len(ref) > 2  # logits and every layer's keys and values
        for i, (a, e) in enumerate(zip(got, ref, strict=True)):
            assert_equal(a, e, f"output {i}")
    assert fmodel.captured.calls == (0, 1, 2)


def test_the_instrumented_model_is_a_drop_in() -> None:
    transformers.logging.set_verbosity_error()
    model, args, _ = gpt2()
    model.eval()
    fmodel = clouseau.instrument(model, select="transformer.h.*", path=None)
    assert fmodel.config is model.config
    assert fmodel.device == model.device
    assert fmodel.get_input_embeddings() is model.get_input_embeddings()
    # generate is clouseau's own: the model's generate with every step captured.
    assert fmodel.generate.__func__ is type(fmodel).generate
    assert list(fmodel.state_dict()) == list(model.state_dict())
    state = {k: v.clone() + 1 for k, v in model.state_dict().items()}
    fmodel.load_state_dict(state)
    assert torch.equal(model.transformer.wte.weight, state["transformer.wte.weight"])
    outer = torch.nn.ModuleDict({"lm": fmodel})
    assert next(iter(outer.state_dict())) == "lm.transformer.wte.weight"
    outer.load_state_dict(outer.state_dict())
    assert repr(fmodel) == (
        "InstrumentedModule(GPT2LMHeadModel, select='transformer.h.*', saving in memory)"
    )
    with pytest.raises(AttributeError, match="no_such_thing"):
        fmodel.no_such_thing  # noqa: B018
    with torch.no_grad():
        assert torch.equal(fmodel(*args).logits, model(*args).logits)
