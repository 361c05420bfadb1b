"""The pure-torch torchvision kernels (tests/torchvision_ops.py) against direct computations."""

from __future__ import annotations

import math

import pytest
import torch

from tests import torchvision_ops

torchvision = pytest.importorskip("torchvision")
if not torchvision_ops.define_schemas():
    pytest.skip("torchvision's own extension serves these operators", allow_module_level=True)
torchvision_ops.enable()


def _iou(a: list[float], b: list[float]) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _greedy(boxes: list[list[float]], scores: list[float], threshold: float) -> list[int]:
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable, as the kernel
    keep: list[int] = []
    for i in order:
        if all(_iou(boxes[i], boxes[k]) <= threshold for k in keep):
            keep.append(i)
    return keep


def _boxes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 20
    size = torch.rand(n, 2, generator=generator, dtype=torch.float64) * 10 + 1
    scores = torch.rand(n, generator=generator, dtype=torch.float64)
    scores[::7] = scores[0]  # ties: the order among equal scores is the stable sort's
    return torch.cat([corner, corner + size], 1), scores


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7])
def test_nms_keeps_what_greedy_suppression_keeps(threshold: float) -> None:
    boxes, scores = _boxes(60, seed=int(threshold * 10))
    keep = torchvision.ops.nms(boxes, scores, threshold)
    assert keep.dtype == torch.long
    assert keep.tolist() == _greedy(boxes.tolist(), scores.tolist(), threshold)


def test_batched_nms_suppresses_within_a_class_only() -> None:
    boxes, scores = _boxes(40, seed=3)
    classes = torch.arange(40) % 3
    keep = torchvision.ops.batched_nms(boxes, scores, classes, 0.2)
    expected: list[int] = []
    for c in range(3):
        members = [i for i in range(40) if classes[i] == c]
        kept = _greedy(
            [boxes[i].tolist() for i in members], [scores[i].item() for i in members], 0.2
        )
        expected += [members[k] for k in kept]
    assert sorted(keep.tolist()) == sorted(expected)
    assert torchvision.ops.nms(boxes[:0], scores[:0], 0.5).shape == (0,)


def _bilinear(feature: torch.Tensor, y: float, x: float) -> torch.Tensor:
    height, width = feature.shape[-2:]
    if y < -1 or y > height or x < -1 or x > width:
        return feature.new_zeros(feature.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = min(int(y), height - 1), min(int(x), width - 1)
    y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
    y, x = (float(y0) if y0 == height - 1 else y), (float(x0) if x0 == width - 1 else x)
    ly, lx = y - y0, x - x0
    return (
        feature[:, y0, x0] * (1 - ly) * (1 - lx)
        + feature[:, y0, x1] * (1 - ly) * lx
        + feature[:, y1, x0] * ly * (1 - lx)
        + feature[:, y1, x1] * ly * lx
    )


def _roi_align_loops(
    feature: torch.Tensor, roi: list[float], scale: float, out: int, ratio: int, aligned: bool
) -> torch.Tensor:
    """RoIAlign of one box written from its definition (Mask R-CNN): average of ``ratio``
    x ``ratio`` bilinear samples per bin."""
    offset = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (v * scale - offset for v in roi)
    width, height = x2 - x1, y2 - y1
    if not aligned:
        width, height = max(width, 1.0), max(height, 1.0)
    bin_h, bin_w = height / out, width / out
    result = feature.new_zeros(feature.shape[0], out, out)
    for i in range(out):
        for j in range(out):
            total = feature.new_zeros(feature.shape[0])
            for a in range(ratio):
                for b in range(ratio):
                    y = y1 + i * bin_h + (a + 0.5) * bin_h / ratio
                    x = x1 + j * bin_w + (b + 0.5) * bin_w / ratio
                    total = total + _bilinear(feature, y, x)
            result[:, i, j] = total / (ratio * ratio)
    return result


@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_averages_bilinear_samples_per_bin(aligned: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 3, 9, 11, generator=generator, dtype=torch.float64)
    rois = torch.tensor(
        [[0, 1.0, 2.0, 15.0, 12.0], [1, 0.0, 0.0, 21.0, 17.0], [0, 5.5, 3.2, 6.0, 4.0]],
        dtype=torch.float64,
    )
    through_op = torch.ops.torchvision.roi_align(features, rois, 0.5, 3, 3, 2, aligned)
    public = torchvision.ops.roi_align(features, rois, 3, 0.5, 2, aligned)
    for k, roi in enumerate(rois.tolist()):
        expected = _roi_align_loops(features[int(roi[0])], roi[1:], 0.5, 3, 2, aligned)
        torch.testing.assert_close(through_op[k], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(public[k], expected, rtol=1e-12, atol=1e-12)
    assert math.isfinite(through_op.sum().item())


def test_roi_align_has_a_fake_kernel_for_export() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.torchvision.roi_align(
            torch.empty(1, 4, 8, 8), torch.empty(5, 5), 1.0, 7, 6, 2, True
        )
    assert out.shape == (5, 4, 7, 6)
