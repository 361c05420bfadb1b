"""Faster R-CNN's calls instrumented, against its eager calls: the first call and the
later ones, per selection.

    python -m bench.detection_calls          # 5 later calls per selection
    python -m bench.detection_calls --calls 2 --select rpn

``fasterrcnn_mobilenet_v3_large_320_fpn`` (``weights=None``, ``min_size=64``,
``max_size=96``) on two images, at two input shapes that alternate; both selections
take the dynamic tier (TorchDynamo regions, module outputs by hooks). Eager calls
interleave with instrumented ones in one process, so a ratio compares like with like on
a loaded machine; the median of each is reported.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
import warnings
from typing import Any

import torch


def _model() -> tuple[torch.nn.Module, tuple[list[torch.Tensor], ...]]:
    importlib.import_module("tests.conftest")  # torchvision's schemas beside CPU torch
    from tests import torchvision_ops

    torchvision_ops.enable()
    import torchvision

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torchvision.models.get_model(
            "fasterrcnn_mobilenet_v3_large_320_fpn", weights=None, weights_backbone=None,
            min_size=64, max_size=96,
        ).eval()  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    shapes = (((128, 160),), ((144, 128), (128, 128)))
    calls = tuple([torch.rand(3, h, w, generator=generator) for h, w in s] for s in shapes)
    return model, calls


def _seconds(fn: Any, images: list[torch.Tensor]) -> float:
    started = time.perf_counter()
    fn(images)
    return time.perf_counter() - started


def measure(select: list[str], later: int) -> dict[str, float]:
    """First and later calls (median) of one selection, and the eager calls beside them."""
    import clouseau

    model, calls = _model()
    for images in calls:  # eager's own first calls (allocator, lazy imports) are not timed
        model(images)
    fmodel = clouseau.instrument(model, select=select, path=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = [_seconds(fmodel, images) for images in calls]
        eager, instrumented = [], []
        for i in range(later):
            images = calls[i % len(calls)]
            eager.append(_seconds(model, images))
            instrumented.append(_seconds(fmodel, images))
    fmodel.close()
    eager_s, later_s = statistics.median(eager), statistics.median(instrumented)
    return {
        "first call s": first[0], "first call, 2nd shape s": first[1],
        "later call s": later_s, "eager call s": eager_s, "later / eager": later_s / eager_s,
        "traces": float(fmodel.traces),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5, help="later calls per selection")
    parser.add_argument("--select", action="append", help="a selection (repeatable; rpn, *)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    for select in [[s] for s in args.select] if args.select else (["rpn"], ["*"]):
        row = measure(select, args.calls)
        print(f"select={select}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()))


if __name__ == "__main__":
    main()
