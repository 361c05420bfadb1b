"""torchvision's classification models: its feature-extraction names, and values."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import clouseau
from clouseau.capture import torch as ct
from tests.models.helpers import assert_equal, check_model

torchvision = pytest.importorskip("torchvision")
feature_extraction = pytest.importorskip("torchvision.models.feature_extraction")

# Models whose input size is fixed by their architecture; every other one takes 64x64.
SIZES = {"inception_v3": 75, "maxvit_t": 224}
FIXED_224 = ("vit_", "swin_")
OPTIONS = {"inception_v3": {"aux_logits": False, "init_weights": False},
           "googlenet": {"aux_logits": False, "init_weights": False}}  # fmt: skip


def classification_models() -> list[str]:
    return list(torchvision.models.list_models(module=torchvision.models))


# Too large to run for names alone (vit_h_14: 630M parameters): traced on the meta device,
# where the trace's run computes shapes only (seconds); names need no values.
ON_META = ("vit_h_14",)


def build(name: str, *, uninitialised: bool = False) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model (eval) and an input; ``uninitialised``: built on the meta device and
    given empty memory (names need no values, and the largest models initialise slowly)."""
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings(), torch.device("meta" if uninitialised else "cpu"):
            warnings.simplefilter("ignore")
            model = torchvision.models.get_model(name, weights=None, **OPTIONS.get(name, {}))
    except NotImplementedError:  # regnet reads a tensor's value while it is built
        return build(name)
    if uninitialised:
        model = model.to_empty(device="cpu")
        with torch.no_grad():
            for tensor in (*model.parameters(), *model.buffers()):
                tensor.zero_()
    size = 224 if name.startswith(FIXED_224) else SIZES.get(name, 64)
    return model.eval(), torch.randn(1, 3, size, size)


def torchvision_names(model: torch.nn.Module) -> list[str]:
    return feature_extraction.get_graph_node_names(model)[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", classification_models())
def test_torchvision_names_are_points(name: str) -> None:
    if name in ON_META:
        model, x = _on_meta(name)
    else:
        model, x = build(name, uninitialised=True)
    graph = ct.trace(model, x)
    names = set(graph.names())
    wanted = torchvision_names(model)
    # Each name is a point, the names of other modules' paths as clouseau's point (names.md).
    points = ct.torchvision_points(graph, wanted)
    moved = dict(graph.meta_value("torchvision_names"))
    assert all(moved[n] != n and n in names for n in moved)  # another module's output
    # A tuple of tensors (`chunk`) is a node but no point: its getitems are (names.md).
    missing = [
        n for n, p in zip(wanted, points, strict=True) if p not in names and not _tuple(graph, n)
    ]
    assert not missing, missing[:10]


def _on_meta(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    with torch.device("meta"):
        model = torchvision.models.get_model(name, weights=None)
    return model.eval(), torch.randn(1, 3, 224, 224, device="meta")


def _tuple(graph: Any, name: str) -> bool:
    return name in graph and str(graph.node(name).outputs[0]).split("[")[0] in ("tuple", "list")


VALUE_MODELS = [
    "vit_b_16", "swin_v2_t", "convnext_tiny", "maxvit_t", "shufflenet_v2_x0_5",
    "inception_v3", "densenet121", "mobilenet_v3_small", "efficientnet_b0", "regnet_x_400mf",
    "resnet18", "squeezenet1_1", "mnasnet0_5",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", VALUE_MODELS)
def test_module_outputs_equal_hooks_and_names_equal_create_feature_extractor(name: str) -> None:
    model, x = build(name)
    check_model(model, x)
    names = torchvision_names(model)
    extractor = feature_extraction.create_feature_extractor(model, return_nodes=names)
    with torch.no_grad():
        expected = extractor(x)
    graph = ct.trace(model, x)
    # torchvision's names, each as the point holding its value (names.md): where torchvision
    # names another module's path (it strips `_<n>` from paths: vit's `ln_1` is `ln_2`'s
    # output), the point is that module's own name.
    points = dict(zip(names, ct.torchvision_points(graph, names), strict=True))
    fmodel = clouseau.instrument(
        model, select=[p for n, p in points.items() if not _tuple(graph, n)], path=None
    )
    with torch.no_grad():
        fmodel(x)
    captured = fmodel.captured
    # torchvision returns a value a later in-place op changed (relu(inplace=True) after
    # an add, inception's `bn`); clouseau saves the value at its point, a snapshot (see
    # clouseau/capture/torch/lowering/lower.py).
    lowered = fmodel.lowered(x)
    snapshots = {
        point
        for point in points.values()
        if point in lowered.graph.names()
        and lowered.graph.point(point).node.key in lowered.traced.probe.mutated_later
    }
    for node, value in expected.items():
        if points[node] in snapshots:
            continue
        if isinstance(value, tuple | list) and not isinstance(value, torch.Size):
            continue  # a tuple of tensors is not a point (see above)
        assert_equal(captured[points[node]], _as_tensor(value), node)
    if name.startswith("vit_"):  # torchvision's `ln_1` of a vit layer is `ln_2`'s output
        moved = dict(graph.meta_value("torchvision_names"))
        assert moved["encoder.layers.encoder_layer_0.ln_1"] == "encoder.layers.encoder_layer_0.ln_2"


def _as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if value is None:
        return torch.zeros(0)
    return torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else None)
