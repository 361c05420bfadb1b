"""Suite-wide set-up.

torchvision from PyPI is built against CUDA torch; beside the CPU torch this project pins,
its C extension cannot load, and ``import torchvision`` then fails while registering fake
kernels for ``torchvision::nms``/``qnms`` (operators the extension would have defined).
The classification models never call those operators, so the suite defines their schemas
(no kernels) before anything imports torchvision. Where the extension loads, this does
nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _define_torchvision_nms_schemas() -> None:
    spec = importlib.util.find_spec("torchvision")  # finds the package without importing it
    if importlib.util.find_spec("torch") is None or spec is None:
        return
    import torch

    for folder in spec.submodule_search_locations or ():
        for extension in Path(folder).glob("_C*.so"):
            try:
                torch.ops.load_library(str(extension))
                return
            except OSError:  # built against another torch: define the schemas instead
                pass
    global _TORCHVISION_LIB
    _TORCHVISION_LIB = torch.library.Library("torchvision", "DEF")
    _TORCHVISION_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


_TORCHVISION_LIB = None
_define_torchvision_nms_schemas()
