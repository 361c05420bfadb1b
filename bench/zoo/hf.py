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
from bench.zoo.hf_inputs import IMAGE, SEQ, VOCAB, inputs

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

WIDTH, HEADS, KV_HEADS, FFN, LAYERS = 32, 2, 1, 64, 2
PATCH = 8
MROPE_RATIO = (2, 3, 3)  # qwen2_vl's and glm4v's default M-RoPE sections, (16, 24, 24)
HORIZON = 4  # a time-series model's prediction length, where its config leaves it unset
IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index")
IMAGE_INPUTS = ("pixel_values", "image_sizes", "image_grid_thw")  # get_image_features reads
TOP_K = ("num_experts_per_tok", "top_k", "moe_topk", "num_selected_experts", "moe_k",
         "num_experts_per_token")  # fmt: skip
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
              "decoder_layers", "num_decoder_layers", "num_encoder_layers", "depth")  # fmt: skip
# The config fields each shrink rule sets (those a type's default config has).
SHRINK: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "n_embed",
                     "d_embed", "word_embed_proj_dim", "projection_dim", "text_embed_dim",
                     "vision_embed_dim", "out_hidden_size"), WIDTH),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "n_heads", "attention_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads",
                     "multi_query_group_num"), KV_HEADS),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
                     "n_inner", "d_ff", "inner_hidden_size", "hidden_dim", "ffn_hidden_size",
                     "mlp_dim"), FFN),
    **dict.fromkeys(LAYER_KEYS, LAYERS),
    **dict.fromkeys(("head_dim", "attention_head_dim", "d_kv", "d_head", "kv_channels"),
                    WIDTH // HEADS),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
                    4),
    **dict.fromkeys(TOP_K, 2),
    **dict.fromkeys(("moe_intermediate_size", "expert_intermediate_size",
                     "shared_expert_intermediate_size"), WIDTH),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"), 1),
    # grouped routing (DeepSeek-V3): the 4 experts in 2 groups, the top 2 from 1 group
    **dict.fromkeys(("n_group", "num_expert_group"), 2),
    **dict.fromkeys(("topk_group",), 1),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len",
                     "max_sequence_length"), 128),
    "vocab_size": VOCAB,
    "image_size": IMAGE,
    "patch_size": PATCH,
    # an image's tokens: one per patch at most (gemma3 pools patches by their ratio)
    "mm_tokens_per_image": (IMAGE // PATCH) ** 2,
    "num_mel_bins": 16,
    # a spectrogram model's fixed frame count (audio-spectrogram-transformer)
    "max_length": 32,
    "max_source_positions": 16,
    "max_target_positions": 64,
    # rotary width at most a head's (16): codegen, gptj
    "rotary_dim": WIDTH // HEADS,
    # a Mamba-2 mixer's head width (its head count follows: _mamba_heads)
    "mamba_d_head": 16,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "first_k_dense_replace": 1,
    # Autoformer's decoder starts from the context's last `label_length` steps: at most
    # the context (the prediction length, HORIZON, where the config leaves it unset)
    "label_length": HORIZON,
    "num_labels": 3,
    # a group norm's groups: 2 divides every shrunk width (bit's 32 divide none of them)
    "num_groups": 2,
    "norm_num_groups": 2,
}  # fmt: skip
WIDTH_KEYS = frozenset(k for k, v in SHRINK.items() if v == WIDTH and "head" not in k)
# Words of fields that end like a width but count something else
WIDTH_FALSE_FRIENDS = ("vocab", "codebook", "position", "max_", "image", "patch", "window",
                       "chunk", "batch", "cache", "num_", "sample", "kernel", "crop", "img")  # fmt: skip
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
    # Bamba's and GraniteMoeHybrid's defaults have no attention layer, and transformers'
    # cache needs one (get_seq_length)
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # EfficientNet's head width is computed (round_filters(1280)), not read from hidden_dim
    "efficientnet": {"hidden_dim": 2560},
    # DiffLlama's differential attention splits the values along pairs of key/value heads
    "diffllama": {"num_key_value_heads": 2},
    # ESMC's attention has no key/value groups
    "esmc": {"num_key_value_heads": HEADS},
    # dots3's sliding-window layers take MLA's query/key width as their head width
    "dots3_note_text": {"head_dim": 16},
    # Gemma-3n's last layers reuse earlier layers' caches: of the 2 kept, none can
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # Fun-ASR-Nano's adaptor narrows to a quarter of the text model's width
    "fun_asr_nano": {"adaptor_config": {"intermediate_size": WIDTH // 4}},
    # Phonon's flow head is conditioned on the backbone's hidden states
    "gradium_phonon_tts": {"flow_head_config": {"condition_dim": WIDTH}},
    # HGNet-V2's stages are sized by stage_*_channels: hidden_sizes repeats their outputs
    "hgnet_v2": {"hidden_sizes": [128, 512, 1024, 2048]},
    # ESM's default leaves its padding id to the checkpoint, and its mask compares to it
    "esm": {"pad_token_id": 1},
    # BLIP-2's default leaves its image placeholder unset, and its forward looks for it
    "blip-2": {"image_token_index": VOCAB - 1},
    # BridgeTower's vision tower has a head per 64 of its width
    "bridgetower": {"vision_config": {"hidden_size": 64}},
    # DBRX's attention reads rope_theta and clip_qkv (clamped, None or not) from attn_config,
    # which no longer declares the first
    "dbrx": {"attn_config": {"kv_n_heads": 1, "rope_theta": 10000.0, "clip_qkv": 8.0}},
}


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
    if not hasattr(config, "pad_token_id"):  # transformers 5 dropped it; emu3, dots3 read it
        config.pad_token_id = None
    _with_mrope(config)
    config._attn_implementation = "eager"
    return config


def _shrunk(
    values: dict[str, Any], overrides: dict[str, Any], widths: frozenset[int] = frozenset()
) -> dict[str, Any]:
    """The changed fields of one (sub-)config; sub-configs recurse. ``widths``: the
    enclosing configs' widths, which fields of this one may repeat."""
    changes: dict[str, Any] = {}
    subs = {k: v for k, v in values.items() if _is_sub_config(k, v)}
    widths = widths | _widths(values) | {w for sub in subs.values() for w in _widths(sub)}
    for key, value in values.items():
        if key in subs:
            # a type's overrides hold wherever its config is a sub-config too
            sub = _shrunk(value, OVERRIDES.get(value.get("model_type"), {}), widths)
            changes[key] = {**value, **sub}
        elif _follows_width(key, value, widths):
            changes[key] = WIDTH
        elif key in STAGE_LISTS and isinstance(value, (list, tuple)) and value:
            changes[key] = [STAGE_LISTS[key](i, v) for i, v in enumerate(value)]
        elif key in SHRINK and isinstance(value, int) and not isinstance(value, bool):
            changes[key] = min(value, SHRINK[key]) if key != "vocab_size" else SHRINK[key]
        elif key == "image_size" and _pair(value):  # (height, width): hiera
            changes[key] = [min(v, IMAGE) for v in value]
        elif key == "vocab_size" and value is None:  # esm's default leaves it to the checkpoint
            changes[key] = VOCAB
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
                "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id"):  # fmt: skip
        if isinstance(values.get(key), int) and values[key] >= VOCAB:
            changes[key] = min(3, VOCAB - 1) if key != "pad_token_id" else 0
    for key in IMAGE_TOKEN_KEYS:  # the image placeholder: the vocabulary's last id
        if isinstance(values.get(key), int) and values[key] >= VOCAB:
            changes[key] = VOCAB - 1
    if "qk_rope_head_dim" in values and "head_dim" in values:  # MLA: rope on head_dim
        changes["head_dim"] = SHRINK["qk_rope_head_dim"]
    for key in TOP_K:  # deepseek_v2's default leaves its top-k unset
        if key in values and values[key] is None and "n_routed_experts" in values:
            changes[key] = SHRINK[key]
    if isinstance(values.get("mamba_n_heads"), int):
        changes["mamba_n_heads"] = _mamba_heads(values, changes)
        if isinstance(values.get("mamba_d_ssm"), int) and "mamba_d_head" in changes:  # falcon_h1
            changes["mamba_d_ssm"] = changes["mamba_n_heads"] * changes["mamba_d_head"]
    pinpoints, vision = values.get("image_grid_pinpoints"), values.get("vision_config") or {}
    if pinpoints and isinstance(vision.get("image_size"), int):  # llava_next: in image tiles
        tile = vision["image_size"]
        changes["image_grid_pinpoints"] = [[h // tile * IMAGE, w // tile * IMAGE]
                                           for h, w in pinpoints]  # fmt: skip
    if "prediction_length" in values and values["prediction_length"] is None:
        changes["prediction_length"] = HORIZON  # time-series transformers leave it unset
    if "head_dim" in values and values["head_dim"] is None:  # hunyuan, ministral need it set
        changes["head_dim"] = WIDTH // HEADS
    for key, period in values.items():  # jamba: a layer kind every `period` from `offset`
        if key.endswith("_layer_period") and isinstance(period, int) and period > LAYERS:
            changes[key] = LAYERS
            offset = key.replace("_period", "_offset")
            if isinstance(values.get(offset), int):
                changes[offset] = min(values[offset], LAYERS - 1)
    if "kv_lora_rank" in values:  # MLA expands keys and values to every head: no groups
        changes.update({k: HEADS for k in SHRINK if SHRINK[k] == KV_HEADS and k in values
                        and "head" in k})  # fmt: skip
    if "qk_head_dim" in values:  # MLA: the query/key width is nope + rope
        changes["qk_head_dim"] = SHRINK["qk_nope_head_dim"] + SHRINK["qk_rope_head_dim"]
    changes.update(_per_layer(values, changes))
    changes.update(_mrope_in_dict(values, changes))
    for key, value in overrides.items():  # a sub-config's override: merged into it
        merged = isinstance(value, dict) and isinstance(changes.get(key), dict)
        changes[key] = {**changes[key], **value} if merged else value
    return changes


def _pair(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple)) and len(value) == 2 and all(type(v) is int for v in value)
    )


def _is_sub_config(key: str, value: Any) -> bool:
    return isinstance(value, dict) and ("model_type" in value or key.endswith("_config"))


def _widths(values: dict[str, Any]) -> frozenset[int]:
    """A config's widths (hidden_size, d_model, ...) before shrinking."""
    return frozenset(v for k, v in values.items() if k in WIDTH_KEYS and type(v) is int)


def _follows_width(key: str, value: Any, widths: frozenset[int]) -> bool:
    """Whether a field is a width repeated by another name: an adapter's or a head's
    input or output dimension equal to the model's (or a sibling model's) width
    (dots3's ``adapter_out_dim``, Phonon's ``condition_dim``), which shrinks with it.
    Widths below 256 are too common a number to tell a width from a count."""
    named = key.endswith(("_dim", "_size", "_channels")) and not any(
        word in key for word in WIDTH_FALSE_FRIENDS
    )
    return named and key not in SHRINK and type(value) is int and value >= 256 and value in widths


def _sections(old: list[int], total: int) -> list[int]:
    """M-RoPE sections in the ratio of ``old``, summing to ``total``."""
    sections = [max(1, part * total // sum(old)) for part in old[:-1]]
    return [*sections, total - sum(sections)]


def _mrope_in_dict(values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A config that validates its M-RoPE sections when built (cosmos3_edge): sections
    for the shrunk head, set before the config is."""
    rope = values.get("rope_parameters")
    if not isinstance(rope, dict) or not isinstance(rope.get("mrope_section"), list):
        return {}
    heads = changes.get("num_attention_heads", values.get("num_attention_heads")) or HEADS
    head = changes.get("head_dim") or changes.get("hidden_size", WIDTH) // heads
    rotary = rope.get("partial_rotary_factor") or values.get("partial_rotary_factor") or 1.0
    total = int(head * rotary) // 2
    return {"rope_parameters": {**rope, "mrope_section": _sections(rope["mrope_section"], total)}}


def _with_mrope(config: Any) -> None:
    """Multimodal RoPE's sections (frames, rows, columns), which qwen2_vl and glm4v read
    from ``rope_parameters`` or else from their modeling code's default for the full-size
    head: in the same ratio, summing to the shrunk head's rotary half-width."""
    subs = [config, *(getattr(config, k, None) for k in getattr(config, "sub_configs", {}))]
    for sub in subs:
        rope = getattr(sub, "rope_parameters", None)
        if not isinstance(rope, dict) or (
            "mrope_section" not in getattr(sub, "ignore_keys_at_rope_validation", ())
            and "mrope_section" not in rope
        ):
            continue
        head = getattr(sub, "head_dim", None) or sub.hidden_size // sub.num_attention_heads
        rotary = rope.get("partial_rotary_factor", getattr(sub, "partial_rotary_factor", 1.0))
        total = int(head * (rotary or 1.0)) // 2
        rope["mrope_section"] = _sections(rope.get("mrope_section") or MROPE_RATIO, total)


def _mamba_heads(values: dict[str, Any], changes: dict[str, Any]) -> int:
    """A Mamba-2 mixer's heads: their width times their count is expand * hidden_size
    (bamba, granitemoehybrid, falcon_h1 check it)."""
    width = changes.get("mamba_d_head", values.get("mamba_d_head"))
    expand = values.get("mamba_expand", 2)
    hidden = changes.get("hidden_size", values.get("hidden_size", WIDTH))
    if not all(isinstance(v, int) for v in (width, expand, hidden)):
        return min(values["mamba_n_heads"], 4)
    return max(1, expand * hidden // width)


def _per_layer(values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Per-layer fields cut to the shrunk layer count: lists (``layer_types``,
    ``mlp_layer_types``), a hybrid's pattern string, and dicts by layer index
    (``per_layer_config``, its entries shrunk too). Configs check them against the count,
    and a list rebuilt from the count alone can drop a kind of layer (a hybrid's every
    attention layer). The layers kept are each distinct combination's first, then the
    first ones, so every kind of layer stays; the count becomes the number kept."""
    for count_key in LAYER_KEYS:
        n, shrunk = values.get(count_key), changes.get(count_key)
        if not isinstance(n, int) or not isinstance(shrunk, int) or shrunk >= n:
            continue
        lists = {k: v for k, v in values.items() if k != count_key and _layer_list(k, v, n)}
        maps = {key: {int(k): v for k, v in value.items()} for key, value in values.items()
                if "layer" in key and isinstance(value, dict) and value
                and all(str(k).isdigit() and int(k) < n for k in value)}  # fmt: skip
        if not lists and not maps:
            continue
        first: dict[str, int] = {}
        for i in range(n):  # repr: entries may be unhashable
            row = [v[i] for v in lists.values()] + [m.get(i) for m in maps.values()]
            first.setdefault(repr(row), i)
        chosen = set(first.values())
        for i in range(n):
            if len(chosen) >= shrunk:
                break
            chosen.add(i)
        keep = sorted(chosen)
        cut: dict[str, Any] = {count_key: len(keep)}
        for key, value in lists.items():
            kept = [_shrunk_value(key, value[i]) for i in keep]
            cut[key] = "".join(kept) if isinstance(value, str) else kept
        for key, by_index in maps.items():
            width = max(len(str(k)) for k in values[key])  # "05": keys may be zero-padded
            cut[key] = {str(new).zfill(width): _shrunk_entry(by_index[old])
                        for new, old in enumerate(keep) if old in by_index}  # fmt: skip
        return cut
    return {}


def _layer_list(key: str, value: Any, n: int) -> bool:
    """Whether ``value`` is a list with an entry per layer (or a pattern string)."""
    if isinstance(value, str):
        return "pattern" in key and len(value) == n
    listed = isinstance(value, (list, tuple)) and len(value) == n
    if not listed or key in STAGE_LISTS:  # a stage list is as long as the stages
        return False
    # a list as long as a deep model's layers, of few distinct entries, is one entry per
    # layer (gemma3n's activation_sparsity_pattern) whatever its name; layer indices are not
    repeats = n >= 8 and len({repr(v) for v in value}) <= n // 2
    return "layer" in key or "block" in key or key in SHRINK or repeats


def _shrunk_value(key: str, value: Any) -> Any:
    """A per-layer list's entry: an int of a shrunk field (``num_key_value_heads_per_layer``)
    shrinks as that field does."""
    base = next((k for k in SHRINK if key == k or key.startswith(k + "_")), None)
    if base is None or not isinstance(value, int) or isinstance(value, bool):
        return value
    return min(value, SHRINK[base])


def _shrunk_entry(value: Any) -> Any:
    """A per-layer entry: a dict of config fields shrinks as a config does."""
    return {**value, **_shrunk(value, {})} if isinstance(value, dict) else value


def build(model_type: str, task: str) -> TorchCase:
    """The tiny model of ``task`` (eval mode) and its two calls and generate call."""
    config = tiny_config(model_type)
    if task == "causal-lm" and getattr(config, "is_decoder", None) is False:
        config.is_decoder = True  # an encoder type's causal LM is its decoder (Reformer checks)
    cls = model_class(model_type, task)
    wanted = getattr(cls, "config_class", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if wanted is not None and not isinstance(config, wanted) and isinstance(text, wanted):
        config = text  # a multimodal type's causal LM is its text model (emu3, dots3)
    model = cls(config).eval()
    calls = tuple(inputs(model, length) for length in SEQ)
    calls = tuple(_with_image_tokens(model, call) for call in calls)
    frames_first = model.main_input_name == "input_features" and not _runs(model, calls[0])
    if frames_first:  # conformers (parakeet, lasr) read (batch, frames, mels); whisper the other
        calls = tuple(_frames_first(call) for call in calls)
    generate = None
    if task in GENERATIVE and hasattr(model, "generate"):
        args, kwargs = inputs(model, SEQ[1], for_generate=True)
        args, kwargs = _frames_first((args, kwargs)) if frames_first else (args, kwargs)
        args, kwargs = _with_image_tokens(model, (args, kwargs))
        generate = (args, {**kwargs, "max_new_tokens": 3, "do_sample": False})
    return TorchCase("transformers", f"{model_type}/{task}", model, calls, generate,
                     task=type(model).__name__)  # fmt: skip


def _with_image_tokens(model: torch.nn.Module, call: Call) -> Call:
    """A vision-language model's call with an image placeholder token per image feature
    (after the first text token), as its processor would write them."""
    args, kwargs = call
    config = model.config
    token = next((getattr(config, k) for k in IMAGE_TOKEN_KEYS
                  if isinstance(getattr(config, k, None), int)), None)  # fmt: skip
    features = getattr(model, "get_image_features", None)
    if token is None or features is None or not {"pixel_values", "input_ids"} <= set(kwargs):
        return call
    images = {k: v for k, v in kwargs.items() if k in IMAGE_INPUTS}
    try:
        with torch.no_grad():
            count = _rows(features(**images))
    except Exception:  # the model's own error shows when it is called
        return call
    ids = kwargs["input_ids"]
    ids = torch.cat([ids[:, :1], torch.full((1, count), token), ids[:, 1:]], dim=1)
    mask = {"attention_mask": torch.ones_like(ids)} if "attention_mask" in kwargs else {}
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        mask["mm_token_type_ids"] = (ids == token).long()  # qwen2_vl's M-RoPE: 1 for images
    return args, {**kwargs, "input_ids": ids, **mask}


def _rows(features: Any) -> int:
    """How many feature vectors (image tokens) ``get_image_features`` returned."""
    if isinstance(features, torch.Tensor):
        return features.numel() // features.shape[-1]
    if isinstance(features, (list, tuple)):
        return sum(_rows(f) for f in features)
    pooled = getattr(features, "pooler_output", None)
    return _rows(pooled if pooled is not None else features.last_hidden_state)


def _runs(model: torch.nn.Module, call: Call) -> bool:
    """Whether the model runs on ``call`` eagerly."""
    try:
        with torch.no_grad():
            model(*call[0], **call[1])
    except Exception:
        return False
    return True


def _frames_first(call: Call) -> Call:
    args, kwargs = call
    return args, {**kwargs, "input_features": kwargs["input_features"].transpose(1, 2)}
