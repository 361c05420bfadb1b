"""Pure-torch CPU kernels for the torchvision operators its detection models call.

torchvision from PyPI is built against CUDA torch; beside the CPU torch this project pins,
its C extension cannot load. ``import torchvision`` then fails while registering fake
kernels for ``torchvision::nms``/``qnms`` (operators the extension would have defined), and
the detection and segmentation builders fail at their first ``nms``. This module:

- :func:`define_schemas` (``tests/conftest.py`` calls it before anything imports
  torchvision): loads the extension where it can, otherwise defines the schemas of
  ``nms``, ``qnms`` and ``roi_align`` with a CPU kernel written in torch operations for
  ``nms`` and ``roi_align``, so that ``import torchvision`` works;
- :func:`enable` (the model zoo calls it): tells torchvision, which decided at import that
  it has no operators, that these exist, so that ``torchvision.ops.nms`` reaches the kernel.

Where the extension loads, both do nothing: its own kernels serve.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

_LIB: torch.library.Library | None = None


def define_schemas() -> bool:
    """Define torchvision's operators (schemas and CPU kernels) unless its extension loads.

    Returns
    -------
    bool
        True when the kernels of this module are the ones in use.
    """
    global _LIB
    if _LIB is not None:
        return True
    spec = importlib.util.find_spec("torchvision")  # finds the package without importing it
    if spec is None:
        return False
    for folder in spec.submodule_search_locations or ():
        for extension in Path(folder).glob("_C*.so"):
            try:
                torch.ops.load_library(str(extension))
                return False
            except OSError:  # built against another torch: define the operators instead
                pass
    _LIB = torch.library.Library("torchvision", "DEF")
    _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.define(
        "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
    )
    _LIB.impl("nms", nms, "CPU")
    _LIB.impl("roi_align", roi_align, "CPU")
    # nms's fake kernel is torchvision's own (registered at its import); roi_align's:
    torch.library.register_fake("torchvision::roi_align", _roi_align_fake, lib=_LIB)
    return True


def enable() -> None:
    """Let torchvision call the operators of :func:`define_schemas` (imports torchvision).

    torchvision checks ``torchvision.extension._has_ops()`` before ``nms``; it answered
    False at import, as the extension did not load. ``roi_align`` holds its own reference
    to it, and without the operator runs torchvision's ``lazy_compile``d fallback (Inductor
    code eagerly, and under TorchDynamo the Python inlined into the caller's graph: two
    results that differ in the last bits); with it, the kernel below, opaque to Dynamo.
    """
    if not define_schemas():
        return
    import sys

    import torchvision.extension
    import torchvision.ops

    torchvision.extension._has_ops = lambda: True
    sys.modules["torchvision.ops.roi_align"]._has_ops = torchvision.extension._has_ops


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression, as torchvision's CPU kernel computes it.

    Boxes in decreasing score order (a stable sort, as the kernel's) are kept unless their
    IoU with a box kept before is above ``iou_threshold``; returns the kept indices, int64.
    """
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    order = torch.sort(scores, stable=True, descending=True).indices
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    width = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(
        min=0
    )
    height = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(
        min=0
    )
    inter = width * height
    overlaps = (inter / (areas[:, None] + areas[None] - inter)) > iou_threshold
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= overlaps[i]
    return torch.tensor(keep, dtype=torch.long)


def roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    """RoIAlign through torchvision's own torch-operation implementation, run eagerly.

    torchvision wraps that implementation in ``lazy_compile``: its first call replaces it
    with ``torch.compile(..., dynamic=True)``, Inductor code whose float results may
    change in the last bits with a recompilation. A kernel gives one value for one input,
    so the function under the wrapper runs.
    """
    from torchvision.ops.roi_align import _roi_align

    eager = getattr(_roi_align, "__wrapped__", _roi_align)  # functools.wraps keeps it
    return eager(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)


def _roi_align_fake(input: torch.Tensor, rois: torch.Tensor, *args: Any) -> torch.Tensor:
    pooled_height, pooled_width = args[1], args[2]
    return input.new_empty((rois.size(0), input.size(1), pooled_height, pooled_width))
