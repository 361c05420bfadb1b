"""torchvision's builders and a sample of timm: models built with random weights.

torchvision: every builder of ``torchvision.models.list_models()`` (classification,
detection, segmentation, video, optical flow, quantizable), with inputs by kind. timm:
one model per architecture prefix in every module (family) of ``timm.list_modules()``,
the smallest variants first (:func:`timm_sample`). Two calls: batch 1 and batch 2 (the
input shape changes, the architecture's fixed image size does not).
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch

from bench.zoo.check_torch import TorchCase

# Names with these words are the small variants of a family; earlier is smaller.
SMALL_WORDS = ("test", "atto", "femto", "pico", "nano", "micro", "tiny", "xxs", "xs",
               "small", "s", "mini", "lite", "b0", "050", "10", "18", "t", "b")  # fmt: skip
TIMM_PER_MODULE_MIN, TIMM_PER_MODULE_SHARE = 1, 8  # a module of n models gives 1 + n/8
TIMM_SIZE = 64


def _import_torchvision() -> Any:
    from tests import torchvision_ops

    torchvision_ops.enable()  # nms and roi_align for the detection models
    import torchvision

    return torchvision


def torchvision_builders() -> list[str]:
    return list(_import_torchvision().models.list_models())


def torchvision_kind(name: str) -> str:
    """The builder's module: classification, detection, segmentation, video, optical_flow,
    quantization."""
    torchvision = _import_torchvision()
    for kind in ("detection", "segmentation", "video", "optical_flow", "quantization"):
        if name in torchvision.models.list_models(module=getattr(torchvision.models, kind)):
            return kind
    return "classification"


# Builder options: no backbone weights (their default downloads them), small detection
# transforms (their default resizes to 800 pixels), no auxiliary heads (they only train).
TV_OPTIONS: dict[str, dict[str, Any]] = {
    "detection": {"min_size": 64, "max_size": 96, "weights_backbone": None},
    "segmentation": {"weights_backbone": None},
    "inception_v3": {"aux_logits": False, "init_weights": False},
    "quantized_inception_v3": {"aux_logits": False, "init_weights": False},
    "googlenet": {"aux_logits": False, "init_weights": False},
    "quantized_googlenet": {"aux_logits": False, "init_weights": False},
}
# Few detections per image: random weights pass every score threshold, so each image keeps
# as many as the model allows (100 to 300), and Mask R-CNN pastes each mask in a Python
# loop (its eager calls alone took 60 s of CPU, its traces 122 Dynamo regions).
TV_DETECTIONS: dict[tuple[str, ...], dict[str, Any]] = {
    ("fasterrcnn", "maskrcnn", "keypointrcnn"): {
        "box_detections_per_img": 8, "rpn_pre_nms_top_n_test": 64, "rpn_post_nms_top_n_test": 64},
    ("retinanet", "fcos", "ssd"): {"detections_per_img": 8, "topk_candidates": 64},
}  # fmt: skip
TV_SIZES = {"inception_v3": 75, "quantized_inception_v3": 75, "maxvit_t": 224}
TV_FIXED_224 = ("vit_", "swin_", "swin_v2")
# S3D pools (2, 7, 7) at the end, after an 8-fold time and 32-fold space reduction
TV_VIDEO = {"mvit_v1_b": (16, 224), "mvit_v2_s": (16, 224), "s3d": (16, 224)}


def torchvision_case(name: str) -> TorchCase:
    torchvision = _import_torchvision()
    kind = torchvision_kind(name)
    options = {**TV_OPTIONS.get(kind, {}), **TV_OPTIONS.get(name, {})}
    for prefixes, fewer in TV_DETECTIONS.items():
        options.update(fewer if name.startswith(prefixes) else {})
    if name.startswith("ssd"):  # SSD fixes its transform's size itself (300 or 320)
        options = {k: v for k, v in options.items() if k not in ("min_size", "max_size")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torchvision.models.get_model(name, weights=None, **options).eval()
    generator = torch.Generator().manual_seed(0)

    def image(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=generator)

    if kind == "detection":
        calls = (((([image(3, 64, 80)],), {})), (([image(3, 72, 64), image(3, 64, 64)],), {}))
    elif kind == "optical_flow":
        # RAFT's correlation pyramid needs 128 pixels; few refinement steps per call
        calls = tuple(((image(b, 3, 128, 128), image(b, 3, 128, 128)), {"num_flow_updates": 2})
                      for b in (1, 2))  # fmt: skip
    elif kind == "video":
        frames, size = TV_VIDEO.get(name, (4, 64))
        calls = tuple(((image(b, 3, frames, size, size),), {}) for b in (1, 2))
    else:
        size = 224 if name.startswith(TV_FIXED_224) else TV_SIZES.get(name, 64)
        calls = tuple(((image(b, 3, size, size),), {}) for b in (1, 2))
    return TorchCase("torchvision", name, model, calls, task=f"{kind}: {type(model).__name__}")


def _smallness(name: str) -> tuple[int, int]:
    words = re.split(r"[_.]", name)
    ranks = [SMALL_WORDS.index(w) for w in words if w in SMALL_WORDS]
    return (min(ranks) if ranks else len(SMALL_WORDS), len(name))


def timm_sample() -> list[str]:
    """The smallest model of every timm module, and of its other architecture prefixes
    (``resnet``, ``seresnet``, ...) up to ``1 + n / 8`` models of a module of ``n``."""
    import timm

    chosen: list[str] = []
    for module in timm.list_modules():
        names = sorted(timm.list_models(module=module), key=_smallness)
        by_prefix: dict[str, str] = {}
        for name in names:
            by_prefix.setdefault(name.split("_")[0], name)
        picks = sorted(by_prefix.values(), key=_smallness)
        chosen += picks[: TIMM_PER_MODULE_MIN + len(names) // TIMM_PER_MODULE_SHARE]
    return chosen


def timm_module(name: str) -> str:
    import timm

    return next(m for m in timm.list_modules() if name in timm.list_models(module=m))


def timm_case(name: str) -> TorchCase:
    """The model at 64 pixels where it takes them (``img_size`` for the fixed-size ones),
    else at its pretrained config's size."""
    import timm

    _import_torchvision()
    generator = torch.Generator().manual_seed(0)
    size = timm.get_pretrained_cfg(name).input_size[-1] if timm.get_pretrained_cfg(name) else 224
    attempts: list[tuple[dict[str, Any], int]] = [({"img_size": TIMM_SIZE}, TIMM_SIZE),
                                                  ({}, TIMM_SIZE), ({}, size)]  # fmt: skip
    error: Exception | None = None
    for options, pixels in attempts:
        try:
            model = timm.create_model(name, pretrained=False, **options).eval()
            x = torch.rand(1, 3, pixels, pixels, generator=generator)
            with torch.no_grad():
                model(x)
        except Exception as e:  # the next attempt, or the last error
            error = e
            continue
        calls = tuple(((torch.rand(b, 3, pixels, pixels, generator=generator),), {})
                      for b in (1, 2))  # fmt: skip
        return TorchCase("timm", name, model, calls,
                         task=f"{timm_module(name)}: {type(model).__name__}")  # fmt: skip
    assert error is not None
    raise error
