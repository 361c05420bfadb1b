"""torchvision's detection and segmentation models (``weights=None``, small images):
every call's outputs and module outputs equal forward hooks on eager, bit for bit, at two
input shapes.

The detection models take the dynamic tier (their transform loops over a list of images,
their post-processing has data-dependent sizes); the segmentation models take torch.fx
and return the ``OrderedDict`` eager returns.
"""

from __future__ import annotations

import fnmatch
import warnings
from typing import Any

import numpy as np
import pytest
import torch

import clouseau
from clouseau.ir.graph import TraceKind
from tests import torchvision_ops
from tests.models.helpers import OutputHooks, tensors_of

torchvision = pytest.importorskip("torchvision")
torchvision_ops.enable()  # nms and roi_align, where torchvision's extension cannot load


def _images(*sizes: tuple[int, int]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(sum(h * w for h, w in sizes))
    return [torch.rand(3, h, w, generator=generator) for h, w in sizes]


# Two calls of different image sizes and counts: 64x80 once resized, then 72x64 and 64x64.
CALLS = (_images((128, 160)), _images((144, 128), (128, 128)))


def _detector(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torchvision.models.get_model(
            name, weights=None, weights_backbone=None, min_size=64, max_size=96
        )
    return model.eval()


def _structure(value: Any) -> Any:
    if isinstance(value, dict):
        return (type(value), tuple((k, _structure(v)) for k, v in value.items()))
    if isinstance(value, tuple | list):
        return (type(value), tuple(_structure(v) for v in value))
    return type(value)


def check_calls(model: torch.nn.Module, calls: tuple[Any, ...], select: list[str]) -> Any:
    """Each call: outputs and every hooked module output that ``select`` names equal eager
    (bitwise), none of them missing."""
    fmodel = clouseau.instrument(model, select=select, path=None)
    for index, images in enumerate(calls):
        hooks = OutputHooks(model)
        try:
            with torch.no_grad():
                want = model(images)
        finally:
            hooks.remove()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the dynamic tier's warning
            with torch.no_grad():
                got = fmodel(images)
        assert _structure(got) == _structure(want)
        for a, e in zip(tensors_of(got), tensors_of(want), strict=True):
            np.testing.assert_array_equal(a.numpy(), e.numpy())
        cap = fmodel.captured
        call = cap.calls[-1]
        assert call == index and not cap.failed_calls
        expected = {
            name: value
            for name, value in hooks.named(cap.graph).items()
            if any(fnmatch.fnmatchcase(name, glob) for glob in select)
        }
        assert expected
        missing = sorted(n for n in expected if cap.get(n, call=call) is None)
        assert not missing, (index, len(missing), missing[:10])
        for name, value in expected.items():
            np.testing.assert_array_equal(cap.get(name, call=call), value.numpy(), err_msg=name)
    return fmodel


@pytest.mark.slow
def test_faster_rcnn_every_module_output_on_every_call() -> None:
    model = _detector("fasterrcnn_mobilenet_v3_large_320_fpn")
    fmodel = check_calls(model, CALLS, ["*"])
    names = fmodel.captured.names()
    assert "roi_heads.box_roi_pool" in names and "images.0" in names
    fmodel.close()


def test_faster_rcnn_rpn_outputs_on_every_call() -> None:
    # Neither tracer traces Faster R-CNN; a selection of module outputs only ("rpn" is a
    # dotless glob, but names modules only) then takes the hook path, not TorchDynamo,
    # whose regions of the whole backbone spent minutes in symbolic shapes at the second
    # image size (issue #25): every module output under rpn, bitwise, on two calls.
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
            weights=None,
            weights_backbone=None,
            min_size=64,
            max_size=96,
            rpn_pre_nms_top_n_test=100,
            rpn_post_nms_top_n_test=50,
        ).eval()
    under = [p for p, _ in model.named_modules() if p.startswith("rpn.")]
    fmodel = check_calls(model, CALLS, ["rpn", *under])
    cap = fmodel.captured
    assert cap.graph.trace_kind is TraceKind.TORCH_HOOKS
    assert {"rpn", "rpn.head.cls_logits", "rpn.anchor_generator"} <= set(cap.names())
    fmodel.close()


def test_segmentation_returns_eagers_ordered_dict() -> None:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torchvision.models.get_model(
            "lraspp_mobilenet_v3_large", weights=None, weights_backbone=None
        ).eval()
    generator = torch.Generator().manual_seed(0)
    calls = tuple(torch.rand(b, 3, 64, 64, generator=generator) for b in (1, 2))
    fmodel = check_calls(model, calls, ["*"])
    assert fmodel.traces == 1
    fmodel.close()
