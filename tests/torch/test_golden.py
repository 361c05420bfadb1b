"""The printed IR of real models is pinned (regenerate with CLOUSEAU_UPDATE_GOLDEN=1)."""

from __future__ import annotations

import torch

import clouseau
from clouseau.ir import insert_saves, verify
from tests.conftest import GOLDEN, check_golden
from tests.torch.models import CNN, ResNet


def test_printed_ir_of_a_cnn_with_saves_is_pinned() -> None:
    torch.manual_seed(0)
    graph = verify(insert_saves(clouseau.trace(CNN().eval(), torch.randn(2, 3, 8, 8)), "relu*"))
    check_golden(GOLDEN / "torch_cnn.txt", str(graph) + "\n")


def test_printed_ir_of_the_export_fallback_is_pinned() -> None:
    from tests.torch.models import ShapeBranch

    graph = verify(clouseau.trace(ShapeBranch().eval(), torch.randn(2, 4, 6, 6)))
    check_golden(GOLDEN / "torch_export_branch.txt", str(graph) + "\n")


def test_printed_ir_of_a_resnet_is_pinned() -> None:
    graph = verify(clouseau.trace(ResNet().eval(), torch.randn(1, 3, 16, 16)))
    check_golden(GOLDEN / "torch_resnet.txt", str(graph) + "\n")
