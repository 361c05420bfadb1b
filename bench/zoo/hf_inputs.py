"""A tiny transformers model's inputs, from its forward's signature and its config.

The main input (``main_input_name``, or the forward's first required parameter where the
model's forward does not take that name: a vision tower called by its parent) is built
by its kind (:data:`MAIN`); the other parameters the model reads (an image beside text,
boxes) follow, then every required parameter still missing, by its name
(:func:`_required`). Two calls, two shapes: ``length`` sets the sequence, and the image
or audio size or the batch follows it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from bench.zoo.check_torch import Call

SEQ = (7, 5)  # the two calls' sequence lengths
TOKENS_FROM = 4  # token ids start above the usual special ids (pad, bos, eos, unk)
VOCAB, IMAGE = 128, 32  # the tiny config's vocabulary and image side (hf.py shrinks to them)
GRID_KEYS = ("grid_thw", "image_grid_thw")  # Qwen2-VL-style towers: each image's patch grid


def inputs(model: torch.nn.Module, length: int, *, for_generate: bool = False) -> Call:
    """Inputs from the model's main input and config, for a sequence of ``length``."""
    config = model.config
    generator = torch.Generator().manual_seed(length)
    parameters = inspect.signature(model.forward).parameters
    main = main_input(model)
    builder = MAIN.get(main)
    if builder is None:
        raise NotImplementedError(f"no input builder for main_input_name {main!r}")
    kwargs = builder(model, length, generator)
    if main != "pixel_values" and "pixel_values" in parameters and hasattr(config, "vision_config"):
        kwargs.update(_beside_text(model, generator))
    if "bbox" in parameters and "input_ids" in kwargs:  # layout models: a box per token
        corner = torch.randint(0, 64, (1, length, 2), generator=generator)
        kwargs["bbox"] = torch.cat([corner, corner + torch.randint(1, 32, (1, length, 2),
                                                                   generator=generator)], -1)  # fmt: skip
    kwargs.update(_required(model, kwargs, length, generator))
    start = getattr(config, "decoder_start_token_id", None) or 0
    if getattr(config, "is_encoder_decoder", False):
        if for_generate:  # transformers 5 reads it from the generation config only
            kwargs["decoder_start_token_id"] = start
        else:
            kwargs["decoder_input_ids"] = torch.full((1, 3), start)
    if for_generate:
        kwargs.pop("attention_mask", None) if main != "input_ids" else None
    return (), kwargs


def main_input(model: torch.nn.Module) -> str:
    """``main_input_name``, unless the forward takes no such parameter (a vision tower
    inherits its parent's ``input_ids``): then the forward's first required parameter."""
    main = getattr(model, "main_input_name", "input_ids")
    required = _required_names(model)
    if main in inspect.signature(model.forward).parameters or not required:
        return main
    return required[0]


def _required_names(model: torch.nn.Module) -> list[str]:
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [name for name, p in inspect.signature(model.forward).parameters.items()
            if p.default is inspect.Parameter.empty and p.kind not in kinds]  # fmt: skip


def _batch(length: int) -> int:
    """Fixed-size inputs change shape by their batch: 1, then 2."""
    return 1 if length == SEQ[0] else 2


def _tokens(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    vocab = getattr(_sub(model.config, "text_config", "decoder"), "vocab_size", VOCAB) or VOCAB
    # below the last id, which a vision-language model's image placeholder takes
    ids = torch.randint(TOKENS_FROM, max(TOKENS_FROM + 1, vocab - 1), (1, length),
                        generator=generator)  # fmt: skip
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _pixels(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    if grid := _grid_key(model):  # a Qwen2-VL-style tower: flat patches
        return _flat_patches(model.config, generator, "pixel_values", grid, images=_batch(length))
    vision = _sub(model.config, "vision_config", "backbone_config")
    channels = getattr(vision, "num_channels", 3)
    size = _side(getattr(vision, "image_size", IMAGE))
    # ViTs interpolate nothing: the same size twice, batch 1 then 2
    return {"pixel_values": torch.randn(_batch(length), channels, size, size,
                                        generator=generator)}  # fmt: skip


def _patch_rows(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    """A Qwen2-VL-style vision tower's ``hidden_states``: its flat patches."""
    grid = _grid_key(model) or GRID_KEYS[0]
    return _flat_patches(model.config, generator, "hidden_states", grid, images=_batch(length))


def _grid_key(model: torch.nn.Module) -> str | None:
    parameters = inspect.signature(model.forward).parameters
    return next((k for k in GRID_KEYS if k in parameters), None)


def _features(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    config = model.config
    mels = getattr(config, "num_mel_bins", 16)
    frames = 2 * getattr(config, "max_source_positions", 16)
    if getattr(config, "model_type", "") != "whisper":
        frames = 8 * length
    return {"input_features": torch.randn(1, mels, frames, generator=generator)}


def _values(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    config = model.config
    max_length, mels = getattr(config, "max_length", None), getattr(config, "num_mel_bins", None)
    if isinstance(max_length, int) and isinstance(mels, int):
        # a spectrogram of fixed frames and mel bins (its positions are learnt per patch)
        return {"input_values": torch.randn(_batch(length), max_length, mels,
                                            generator=generator)}  # fmt: skip
    return {"input_values": torch.randn(1, 400 * length, generator=generator)}


def _past_values(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    # a time series: the config fixes its lengths, not the batch
    return _series(model.config, model, _batch(length), generator)


def _mel_frames(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    """An audio encoder's log-mel frames, (batch, frames, mels) (gemma3n)."""
    config = model.config
    mels = getattr(config, "input_feat_size", None) or getattr(config, "num_mel_bins", 16)
    return {"audio_mel": torch.randn(1, 8 * length, mels, generator=generator)}


def _trajectory(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    """A Decision Transformer's trajectory: states, actions, rewards, returns to go and
    timesteps, one of each per step."""
    config = model.config
    steps = (1, length)
    return {
        "states": torch.randn(*steps, config.state_dim, generator=generator),
        "actions": torch.randn(*steps, config.act_dim, generator=generator),
        "rewards": torch.randn(*steps, 1, generator=generator),
        "returns_to_go": torch.randn(*steps, 1, generator=generator),
        "timesteps": torch.arange(length)[None],
        "attention_mask": torch.ones(steps, dtype=torch.long),
    }


def _queries(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    """A Q-Former alone: its queries, and the image features they attend to."""
    config = model.config
    width = getattr(config, "encoder_hidden_size", None) or config.hidden_size
    return {
        "query_embeds": torch.randn(1, 4, config.hidden_size, generator=generator),
        "encoder_hidden_states": torch.randn(1, length, width, generator=generator),
    }


# The main input's builder by its name: (model, length, generator) -> inputs.
MAIN: dict[str, Callable[[torch.nn.Module, int, Any], dict[str, Any]]] = {
    "input_ids": _tokens,
    "pixel_values": _pixels,
    "hidden_states": _patch_rows,
    "input_features": _features,
    "input_values": _values,
    "past_values": _past_values,
    "audio_mel": _mel_frames,
    "states": _trajectory,
    "query_embeds": _queries,
}


def _required(
    model: torch.nn.Module, kwargs: dict[str, Any], length: int, generator: Any
) -> dict[str, Any]:
    """The required parameters still missing: a grid beside flat patches, text ids
    beside an image (BLIP-2, Grounding DINO), an image beside text, and a mask (every
    position valid) of the main input's leading dimensions."""
    missing = [n for n in _required_names(model) if n not in kwargs]
    found: dict[str, Any] = {}
    main = next((kwargs[n] for n in (main_input(model), *kwargs) if n in kwargs), None)
    for name in missing:
        if name == "pixel_position_ids":
            found.update(_positioned_patches(model, length, generator))
        elif name == "input_ids":
            found.update(_tokens(model, length, generator))
        elif name == "pixel_values":
            found.update(_pixels(model, length, generator))
        elif name.endswith("_mask") and isinstance(main, torch.Tensor):
            found[name] = _mask(model, name, main)
    return found


def _positioned_patches(model: torch.nn.Module, length: int, generator: Any) -> dict[str, Any]:
    """Patches with their (x, y) positions (gemma4's vision tower): a square grid whose
    side the pooling kernel divides, flattened per image."""
    config = model.config
    kernel = getattr(config, "pooling_kernel_size", 1) or 1
    side = kernel * (1 if length == SEQ[0] else 2)
    channels = getattr(config, "num_channels", 3)
    width = channels * config.patch_size**2
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    positions = torch.stack([xs.flatten(), ys.flatten()], -1)[None]
    return {"pixel_values": torch.rand(1, side * side, width, generator=generator),
            "pixel_position_ids": positions}  # fmt: skip


def _mask(model: torch.nn.Module, name: str, main: torch.Tensor) -> torch.Tensor:
    """A required mask of every position valid: the forward's annotation says whether
    valid is True (a ``BoolTensor``) or 1; an audio encoder's mel mask marks padding
    (gemma3n: ``audio_mel_mask`` True where padded)."""
    shape = main.shape[:2]
    if "mel" in name:
        return torch.zeros(shape, dtype=torch.bool)
    annotation = str(inspect.signature(model.forward).parameters[name].annotation)
    dtype = torch.bool if "Bool" in annotation or "bool" in annotation else torch.long
    return torch.ones(shape, dtype=dtype)


def _beside_text(model: torch.nn.Module, generator: Any) -> dict[str, Any]:
    """A dual encoder's (CLIP-like) or a vision-language model's image beside its text,
    of the vision config's size."""
    config = model.config
    parameters = inspect.signature(model.forward).parameters
    vision = config.vision_config
    size = _side(getattr(vision, "image_size", IMAGE))
    found = {"pixel_values": torch.randn(1, getattr(vision, "num_channels", 3), size, size,
                                         generator=generator)}  # fmt: skip
    if "image_grid_thw" in parameters:  # qwen2_vl, glm4v: patches, flat, and their grid
        found.update(_flat_patches(vision, generator, "pixel_values", "image_grid_thw"))
    if "image_sizes" in parameters and _reads_image_sizes(model):
        found["image_sizes"] = torch.tensor([[size, size]])  # each image's own size
        found["pixel_values"] = _tiled(config, found["pixel_values"])
    return found


def _series(config: Any, model: torch.nn.Module, batch: int, generator: Any) -> dict[str, Any]:
    """A time series' inputs: the context and the lags read before it (values and their
    observed mask), and, where the model takes them, the time features of the past and
    of the horizon (the future's values decode, as in training)."""
    parameters = inspect.signature(model.forward).parameters
    past = config.context_length + max(getattr(config, "lags_sequence", None) or [0])
    channels = getattr(config, "input_size", None) or getattr(config, "num_input_channels", 1)
    lagged = "past_time_features" in parameters  # the GluonTS-style models (1-d series)
    shape = (batch, past) if lagged and channels == 1 else (batch, past, channels)
    values = torch.randn(*shape, generator=generator)
    mask = "past_observed_mask" if "past_observed_mask" in parameters else "observed_mask"
    series = {"past_values": values, mask: torch.ones_like(values)}
    if lagged:
        features = config.num_time_features  # may be 0: the config counts them
        horizon = config.prediction_length
        series["past_time_features"] = torch.randn(batch, past, features, generator=generator)
        series["future_time_features"] = torch.randn(batch, horizon, features,
                                                     generator=generator)  # fmt: skip
        series["future_values"] = torch.randn(batch, horizon, *shape[2:], generator=generator)
    return series


def _flat_patches(
    vision: Any, generator: Any, key: str, grid: str, *, images: int = 1
) -> dict[str, Any]:
    """Images as a Qwen2-VL-style processor writes them: a row per patch (channels times
    frames times pixels) under ``key``, and each image's grid (frames, rows, columns) in
    patches under ``grid``."""
    patch, frames = vision.patch_size, getattr(vision, "temporal_patch_size", 1)
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
    side = _side(getattr(vision, "image_size", IMAGE)) // patch
    rows = torch.randn(images * side * side, channels * frames * patch * patch,
                       generator=generator)  # fmt: skip
    return {key: rows, grid: torch.tensor([[1, side, side]] * images)}


def _reads_image_sizes(model: torch.nn.Module) -> bool:
    """Whether the model reads ``image_sizes``: anyres tiles (llava_next), or a vision
    tower that takes them (mistral3's Pixtral); llava's CLIP tower refuses them."""
    config = model.config
    if getattr(config, "image_grid_pinpoints", None):
        return True
    towers = [m for m in model.modules() if getattr(m, "config", None) is config.vision_config]
    return any("image_sizes" in inspect.signature(m.forward).parameters for m in towers)


def _tiled(config: Any, image: torch.Tensor) -> torch.Tensor:
    """An image as anyres models read it (llava_next's ``image_grid_pinpoints``): the tiles
    of the grid its size picks, after the whole image resized, as the processor cuts them;
    other models take the image as it is."""
    pinpoints = getattr(config, "image_grid_pinpoints", None)
    if not pinpoints:
        return image
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    size = image.shape[-1]
    tiles = image_size_to_num_patches((size, size), pinpoints, size)
    return image[:, None].expand(-1, tiles, -1, -1, -1).contiguous()


def _side(size: Any) -> int:
    """An image's side from a config's ``image_size``: an int, or (height, width) square."""
    if isinstance(size, (list, tuple)) and size and type(size[0]) is int:
        return size[0]
    return size if type(size) is int else IMAGE


def _sub(config: Any, *names: str) -> Any:
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None:
            return sub
    return config
