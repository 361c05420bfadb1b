"""Hugging Face transformers: every registered model type, from a tiny random config.

The tiny config is derived generically from the type's default config
(:func:`tiny_config`): widths, layers, heads, experts, vocabulary and image/audio sizes
shrink, keeping the ratios architectures check (heads divide the width, key/value heads
divide the heads, a head's width is width / heads). :data:`OVERRIDES` holds the per-type
exceptions, each with the reason the generic rule fails. The task classes that apply
(:data:`TASKS`) are instantiated and fed inputs built from ``main_input_name`` and the
config (:func:`inputs`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from bench.zoo.check_torch import Call, TorchCase

# (task, the auto mapping of its classes); a type gets a case per mapping that names it.
TASKS: tuple[tuple[str, str], ...] = (
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),
    ("image-text-to-text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
)
GENERATIVE = ("causal-lm", "seq2seq-lm", "speech-seq2seq")

WIDTH, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 32, 2, 1, 64, 128, 2
IMAGE, PATCH = 32, 8
# The config fields each shrink rule sets (those a type's default config has).
SHRINK: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "n_embed",
                     "d_embed", "word_embed_proj_dim", "projection_dim", "text_embed_dim",
                     "vision_embed_dim"), WIDTH),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "n_heads", "attention_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads",
                     "multi_query_group_num"), KV_HEADS),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
                     "n_inner", "d_ff", "inner_hidden_size", "hidden_dim", "ffn_hidden_size",
                     "mlp_dim"), FFN),
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers",
                     "encoder_layers", "decoder_layers", "num_decoder_layers",
                     "num_encoder_layers", "depth"), LAYERS),
    **dict.fromkeys(("head_dim", "attention_head_dim", "d_kv", "d_head", "kv_channels"),
                    WIDTH // HEADS),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
                    4),
    **dict.fromkeys(("num_experts_per_tok", "top_k", "moe_topk", "num_selected_experts"), 2),
    **dict.fromkeys(("moe_intermediate_size", "expert_intermediate_size",
                     "shared_expert_intermediate_size"), WIDTH),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts"), 1),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len",
                     "max_sequence_length"), 128),
    "vocab_size": VOCAB,
    "image_size": IMAGE,
    "patch_size": PATCH,
    "num_mel_bins": 16,
    "max_source_positions": 16,
    "max_target_positions": 64,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "first_k_dense_replace": 1,
    "num_labels": 3,
}  # fmt: skip
# List fields: one entry per stage, shrunk to small values, as many stages as before.
STAGE_LISTS: dict[str, Callable[[int, int], int]] = {
    "depths": lambda i, v: 1,
    "hidden_sizes": lambda i, v: 16 * (i + 1),
    "embed_dims": lambda i, v: 16 * (i + 1),
    "embed_dim_list": lambda i, v: 16 * (i + 1),
    "num_heads": lambda i, v: 1,
    "num_attention_heads": lambda i, v: 1,
    "neck_hidden_sizes": lambda i, v: 16,
}
# Per-type exceptions to the generic rule: {type: {field: value}}, each with its reason.
OVERRIDES: dict[str, dict[str, Any]] = {
    # Funnel checks block_sizes, not num_hidden_layers
    "funnel": {"block_sizes": [1, 1], "num_decoder_layers": 1},
    # Reformer's axial position shape must multiply to the sequence length it pads to
    "reformer": {"axial_pos_shape": [8, 8], "axial_pos_embds_dim": [16, 16]},
    # Mamba2's heads times their width must be expand * hidden_size
    "mamba2": {"num_heads": 4, "head_dim": 16, "n_groups": 1},
    # ProphetNet's n-gram streams count heads in their own field
    "prophetnet": {"num_encoder_attention_heads": 2, "num_decoder_attention_heads": 2},
}
SEQ = (7, 5)  # the two calls' sequence lengths
TOKENS_FROM = 4  # token ids start above the usual special ids (pad, bos, eos, unk)


def model_types() -> list[str]:
    """Every model type the installed transformers registers with a model class."""
    from transformers.models.auto import modeling_auto

    return sorted(modeling_auto.MODEL_MAPPING_NAMES)


def cases() -> list[tuple[str, str]]:
    """(model type, task) pairs: every type's task classes; each type's first (most
    specific) task comes before every type's other tasks, so a sweep cut short has
    covered every type once."""
    from transformers.models.auto import modeling_auto

    per_type = [
        [(model_type, task) for task, mapping in TASKS
         if model_type in getattr(modeling_auto, mapping, {})]
        for model_type in model_types()
    ]  # fmt: skip
    return [c[0] for c in per_type if c] + [t for c in per_type for t in c[1:]]


def model_class(model_type: str, task: str) -> type[torch.nn.Module]:
    import transformers
    from transformers.models.auto import modeling_auto

    mapping = dict(TASKS)[task]
    name = getattr(modeling_auto, mapping)[model_type]
    return getattr(transformers, name if isinstance(name, str) else name[0])


def tiny_config(model_type: str) -> Any:
    """The type's default config shrunk by :data:`SHRINK` and :data:`OVERRIDES`."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    default = cls()
    changes = _shrunk(default.to_dict(), OVERRIDES.get(model_type, {}))
    config = cls(**changes)
    config._attn_implementation = "eager"
    return config


def _shrunk(values: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The changed fields of one (sub-)config; sub-configs recurse."""
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            changes[key] = {**value, **_shrunk(value, {})}
        elif key in STAGE_LISTS and isinstance(value, (list, tuple)) and value:
            changes[key] = [STAGE_LISTS[key](i, v) for i, v in enumerate(value)]
        elif key in SHRINK and isinstance(value, int) and not isinstance(value, bool):
            changes[key] = min(value, SHRINK[key]) if key != "vocab_size" else SHRINK[key]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
                "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id"):  # fmt: skip
        if isinstance(values.get(key), int) and values[key] >= VOCAB:
            changes[key] = min(3, VOCAB - 1) if key != "pad_token_id" else 0
    changes.update(overrides)
    return changes


def build(model_type: str, task: str) -> TorchCase:
    """The tiny model of ``task`` (eval mode) and its two calls and generate call."""
    config = tiny_config(model_type)
    model = model_class(model_type, task)(config).eval()
    calls = tuple(inputs(model, length) for length in SEQ)
    generate = None
    if task in GENERATIVE and hasattr(model, "generate"):
        args, kwargs = inputs(model, SEQ[1], for_generate=True)
        generate = (args, {**kwargs, "max_new_tokens": 3, "do_sample": False})
    return TorchCase("transformers", f"{model_type}/{task}", model, calls, generate,
                     task=type(model).__name__)  # fmt: skip


def _sub(config: Any, *names: str) -> Any:
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None:
            return sub
    return config


def inputs(model: torch.nn.Module, length: int, *, for_generate: bool = False) -> Call:
    """Inputs from the model's ``main_input_name`` and config, for a sequence of
    ``length`` (images and audio scale with it: two calls, two shapes)."""
    config = model.config
    generator = torch.Generator().manual_seed(length)
    main = getattr(model, "main_input_name", "input_ids")
    kwargs: dict[str, Any] = {}
    if main == "input_ids":
        vocab = getattr(_sub(config, "text_config", "decoder"), "vocab_size", VOCAB) or VOCAB
        ids = torch.randint(TOKENS_FROM, max(TOKENS_FROM + 1, vocab), (1, length),
                            generator=generator)  # fmt: skip
        kwargs["input_ids"] = ids
        kwargs["attention_mask"] = torch.ones_like(ids)
    elif main == "pixel_values":
        vision = _sub(config, "vision_config", "backbone_config")
        channels = getattr(vision, "num_channels", 3)
        size = getattr(vision, "image_size", IMAGE)
        size = size if isinstance(size, int) else IMAGE
        scale = 1 if length == SEQ[0] else 2  # ViTs interpolate nothing: same size twice
        kwargs["pixel_values"] = torch.randn(scale, channels, size, size, generator=generator)
    elif main == "input_features":
        mels = getattr(config, "num_mel_bins", 16)
        frames = 2 * getattr(config, "max_source_positions", 16)
        if getattr(config, "model_type", "") != "whisper":
            frames = 8 * length
        kwargs["input_features"] = torch.randn(1, mels, frames, generator=generator)
    elif main == "input_values":
        kwargs["input_values"] = torch.randn(1, 400 * length, generator=generator)
    else:
        raise NotImplementedError(f"no input builder for main_input_name {main!r}")
    parameters = inspect.signature(model.forward).parameters
    if main != "pixel_values" and "pixel_values" in parameters and hasattr(config, "vision_config"):
        # a dual encoder (CLIP-like) reads both: the image of the vision config's size
        vision = config.vision_config
        size = getattr(vision, "image_size", IMAGE)
        kwargs["pixel_values"] = torch.randn(1, getattr(vision, "num_channels", 3), size, size,
                                             generator=generator)  # fmt: skip
    start = getattr(config, "decoder_start_token_id", None) or 0
    if getattr(config, "is_encoder_decoder", False):
        if for_generate:  # transformers 5 reads it from the generation config only
            kwargs["decoder_start_token_id"] = start
        else:
            kwargs["decoder_input_ids"] = torch.full((1, 3), start)
    if for_generate:
        kwargs.pop("attention_mask", None) if main != "input_ids" else None
    return (), kwargs
