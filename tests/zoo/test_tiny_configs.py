"""The sweep's generic tiny-config and input rules (bench/zoo/hf.py) on the types that need them."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch
from transformers import CONFIG_MAPPING

from bench.zoo import hf


@pytest.mark.parametrize("model_type", ["kimi_linear", "bailing_hybrid", "lfm3"])
def test_a_hybrid_keeps_every_kind_of_layer(model_type: str) -> None:
    default, tiny = CONFIG_MAPPING[model_type](), hf.tiny_config(model_type)
    assert set(tiny.layer_types) == set(default.layer_types)
    assert len(tiny.layer_types) == tiny.num_hidden_layers < default.num_hidden_layers


def test_per_layer_config_entries_follow_their_layers() -> None:
    # gemma4's per-layer entries are its full-attention layers: so after the cut too
    def layers(values: dict) -> tuple[set[int], set[int], list[dict]]:
        entries = values["per_layer_config"]
        full = {i for i, kind in enumerate(values["layer_types"]) if kind == "full_attention"}
        return {int(k) for k in entries}, full, list(entries.values())

    default = CONFIG_MAPPING["gemma4_text"]().to_dict()
    changes = hf._shrunk(default, {})
    (old_keys, old_full, _), (keys, full, entries) = layers(default), layers(changes)
    assert old_keys == old_full and keys == full and keys
    assert max(keys) < changes["num_hidden_layers"] == len(changes["layer_types"])
    assert all(e["head_dim"] <= hf.WIDTH // hf.HEADS for e in entries)
    hf.tiny_config("gemma4_text")  # and the config takes them


def test_grouped_routing_and_mla_shrink_together() -> None:
    tiny = hf.tiny_config("deepseek_v3")
    assert tiny.n_routed_experts % tiny.n_group == 0 and tiny.topk_group <= tiny.n_group
    assert tiny.num_key_value_heads == tiny.num_attention_heads  # MLA: no key/value groups
    assert tiny.head_dim == tiny.qk_rope_head_dim


def test_conformer_features_are_frames_first() -> None:
    case = hf.build("parakeet_ctc", "base")
    (_, kwargs) = case.calls[0]
    assert kwargs["input_features"].shape[-1] == case.model.config.encoder_config.num_mel_bins
    with torch.no_grad():
        case.model(**kwargs)  # runs: the frames-first layout is the model's own


# llava_next: anyres tiles and image_sizes; mistral3: Pixtral reads image_sizes; qwen2_vl,
# glm4v: flat patches, their grid and multimodal RoPE sections for the shrunk head
@pytest.mark.parametrize("model_type", ["llava", "paligemma", "llava_next", "mistral3",
                                        "qwen2_vl", "glm4v"])  # fmt: skip
def test_a_vision_language_call_has_a_placeholder_per_image_feature(model_type: str) -> None:
    case = hf.build(model_type, "image-text-to-text")
    for _, kwargs in case.calls:
        assert (kwargs["input_ids"] == case.model.config.image_token_id).sum() > 0
        with torch.no_grad():
            case.model(**kwargs)  # the model checks that the counts match


@pytest.mark.parametrize("model_type", ["bamba", "falcon_h1", "sapiens2"])
def test_mamba_heads_and_per_layer_counts_fit_the_shrunk_width(model_type: str) -> None:
    tiny = hf.tiny_config(model_type)  # each config validates these itself
    for heads in tiny.to_dict().get("num_key_value_heads_per_layer") or ():
        assert heads <= tiny.num_attention_heads
    task = next(task for t, task in hf.cases() if t == model_type)  # the type's first
    case = hf.build(model_type, task)
    with torch.no_grad():
        case.model(*case.calls[0][0], **case.calls[0][1])


@pytest.mark.parametrize(
    ("model_type", "task"),
    [
        ("gemma3", "causal-lm"),  # its image pooling's stride: patches per side / tokens per side
        ("autoformer", "base"),  # time series: prediction_length set, past_values and lags
        ("time_series_transformer", "base"),
        ("patchtst", "base"),  # time series of (batch, context, channels)
        ("audio-spectrogram-transformer", "audio-classification"),  # (batch, frames, mels)
    ],
)
def test_a_tiny_model_runs_at_both_shapes(model_type: str, task: str) -> None:
    case = hf.build(model_type, task)
    shapes = []
    for args, kwargs in case.calls:
        with torch.no_grad():
            case.model(*args, **kwargs)
        shapes.append([tuple(v.shape) for v in kwargs.values() if isinstance(v, torch.Tensor)])
    assert shapes[0] != shapes[1]  # two calls, two shapes


@pytest.mark.parametrize(
    ("model_type", "task"),
    [
        ("glm4v_vision", "base"),  # a vision tower: flat patches as hidden_states, and the grid
        ("cosmos3_edge_vision", "base"),  # flat patches as pixel_values
        ("decision_transformer", "base"),  # a trajectory: states, actions, rewards, ...
        ("gemma3n_audio", "base"),  # mel frames and their (padding) mask
        ("bit", "image-classification"),  # group norms: the group count divides the widths
        ("diffllama", "causal-lm"),  # an override: key/value heads in pairs
        ("hiera", "image-classification"),  # image_size as (height, width)
    ],
)
def test_inputs_follow_the_forward_signature(model_type: str, task: str) -> None:
    case = hf.build(model_type, task)
    shapes = []
    for args, kwargs in case.calls:
        with torch.no_grad():
            case.model(*args, **kwargs)  # runs: every required parameter is given
        shapes.append([tuple(v.shape) for v in kwargs.values() if isinstance(v, torch.Tensor)])
    assert shapes[0] != shapes[1]  # two calls, two shapes


def test_a_width_repeated_by_another_name_shrinks_with_it() -> None:
    # dots3: its adapters map the vision and audio widths to the text model's width
    tiny = hf.tiny_config("dots3_note")
    assert tiny.vision_config.adapter_in_dim == tiny.vision_config.hidden_size
    assert tiny.vision_config.adapter_out_dim == tiny.text_config.hidden_size
    # an override of a sub-config's type holds where that config is a sub-config
    assert tiny.text_config.head_dim == hf.OVERRIDES["dots3_note_text"]["head_dim"]


def test_mrope_sections_fit_the_shrunk_head_before_the_config_validates() -> None:
    tiny = hf.tiny_config("cosmos3_edge_text")  # it checks the sections when built
    assert sum(tiny.rope_parameters["mrope_section"]) == tiny.head_dim // 2
