"""Names, modules, ops and sources of traced graphs (torch.fx path)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.fx as fx

from clouseau.capture import torch as ct
from clouseau.capture.torch.naming.points import LocalNamer
from clouseau.ir.graph import DType, NodeKind, OpaqueSpec, TensorSpec, TraceKind
from clouseau.ir.verify import verify
from tests.torch import models

RESNET_NAMES = (
    "x", "conv1", "bn1", "relu", "maxpool",
    *(
        f"{layer}.{block}.{n}"
        for layer, block in (("layer1", 0), ("layer1", 1))
        for n in ("conv1", "bn1", "relu", "conv2", "bn2", "add", "relu_1")
    ),
    "layer2.0.conv1", "layer2.0.bn1", "layer2.0.relu", "layer2.0.conv2", "layer2.0.bn2",
    "layer2.0.downsample.0", "layer2.0.downsample.1", "layer2.0.add", "layer2.0.relu_1",
    "layer2.1.conv1", "layer2.1.bn1", "layer2.1.relu", "layer2.1.conv2", "layer2.1.bn2",
    "layer2.1.add", "layer2.1.relu_1",
    "avgpool", "flatten", "fc",
)  # fmt: skip


def resnet_graph():
    return ct.trace(models.ResNet().eval(), torch.randn(2, 3, 16, 16))


def test_resnet_node_names_follow_torchvision() -> None:
    g = verify(resnet_graph())
    assert g.trace_kind is TraceKind.TORCH_FX
    ops = tuple(n.name for n in g.nodes if n.kind is not NodeKind.OUTPUT)
    assert ops == RESNET_NAMES
    assert g.nodes[-1].name == "output" and g.nodes[-1].kind is NodeKind.OUTPUT


def test_resnet_module_outputs_are_aliases() -> None:
    g = resnet_graph()
    assert g.point("layer1.0").ref.node == "layer1.0.relu_1"
    assert g.point("layer1").ref.node == "layer1.1.relu_1"
    assert g.point("layer2.0.downsample").ref.node == "layer2.0.downsample.1"
    names = g.names()
    assert names.index("layer1.0") == names.index("layer1.0.relu_1") + 1
    assert g.node("layer1.1.relu_1").aliases == ((0, "layer1.1"), (0, "layer1"))


def test_names_equal_torchvision_algorithm() -> None:
    # torchvision's get_graph_node_names, re-derived from the same fx trace: a node is
    # "<module path>.<fx node name>" (a leaf call: the path), the fx suffix stripped and a
    # counter found by scanning earlier names. Our O(1) namer must agree on every node.
    model = models.Encoder().eval()
    g = ct.trace(model, torch.randn(2, 5, 4))
    tracer = _ScopeTracer()
    graph = tracer.trace(model)
    expected = []
    for node in graph.nodes:
        if node.op == "output":
            continue
        path = tracer.scopes[node]
        qual = path if node.op == "call_module" else (f"{path}.{node}" if path else str(node))
        expected.append(_torchvision_qualname(qual, expected))
    # (a leaf returning a tuple is "<path>:tuple"; "<path>" names its first element)
    ours = (n.name.removesuffix(":tuple") for n in g.nodes if n.kind is not NodeKind.OUTPUT)
    assert tuple(ours) == tuple(expected)


class _ScopeTracer(fx.Tracer):
    def __init__(self) -> None:
        super().__init__()
        self.path = ""
        self.scopes: dict[fx.Node, str] = {}

    def call_module(self, m, forward, args, kwargs):  # type: ignore[no-untyped-def]
        outer, self.path = self.path, self.path_of_module(m)
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self.path = outer

    def create_proxy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        proxy = super().create_proxy(*args, **kwargs)
        self.scopes[proxy.node] = self.path
        return proxy


def _torchvision_qualname(qual: str, existing: list[str]) -> str:
    if re.match(r".+_[0-9]+$", qual) is not None:
        qual = qual.rsplit("_", 1)[0]
    for name in reversed(existing):
        if re.match(rf"{re.escape(qual)}(_[0-9]+)?$", name) is not None:
            postfix = name.replace(qual, "")
            return f"{qual}_{int(postfix[1:]) + 1 if postfix else 1}"
    return qual


def test_local_namer_counters() -> None:
    namer = LocalNamer()
    got = [
        namer.name(q) for q in ("relu", "relu_1", "a.add", "a.add_3", "relu_7", "a.relu", "relu")
    ]
    assert got == ["relu", "relu_1", "a.add", "a.add_1", "relu_2", "a.relu", "relu_3"]


def test_node_fields() -> None:
    g = resnet_graph()
    conv = g.node("layer1.0.conv1")
    assert (conv.op, conv.module, conv.module_type, conv.key) == (
        "conv2d",
        "layer1.0.conv1",
        "Conv2d",
        "layer1_0_conv1",
    )
    assert conv.target == "torch.nn.modules.conv.Conv2d"
    assert conv.outputs == (TensorSpec((2, 8, 4, 4), conv.outputs[0].dtype),)
    add = g.node("layer1.0.add")
    assert (add.op, add.module, add.module_type, add.target) == (
        "add",
        "layer1.0",
        "BasicBlock",
        "operator.iadd",
    )
    assert [r.node for r in add.inputs] == ["layer1.0.bn2", "maxpool"]
    flat = g.node("flatten")
    assert (flat.op, flat.module, flat.module_type, flat.target) == (
        "flatten",
        "",
        "ResNet",
        "torch.flatten",
    )
    assert g.node("x").kind is NodeKind.INPUT
    assert g.node("bn1").op == "batchnorm2d" and g.node("relu").op == "relu"


def test_sources_point_at_model_code() -> None:
    g = resnet_graph()
    src = g.node("layer1.0.add").source
    assert src is not None and src.file.endswith("models.py") and src.code == "out += identity"
    assert g.node("fc").source.code == "x = self.fc(x)"  # type: ignore[union-attr]


def test_modules_table() -> None:
    model = models.ResNet()
    g = ct.trace(model, torch.randn(1, 3, 16, 16))
    table = {m.path: m for m in g.modules}
    assert set(table) == {p for p, _ in model.named_modules()}
    assert table[""].type == "ResNet"
    assert table[""].params == sum(p.numel() for p in model.parameters())
    assert table["layer1.0"].type == "BasicBlock"
    assert table["layer1.0"].params == sum(p.numel() for p in model.layer1[0].parameters())


def test_encoder_names_and_opaque_values() -> None:
    g = ct.trace(models.Encoder().eval(), torch.randn(2, 5, 4))
    # A leaf module returning a tuple: the call is no point, each element read is.
    attn = g.node("layers.0.attn:tuple")
    assert attn.op == "multiheadattention" and isinstance(attn.outputs[0], OpaqueSpec)
    assert g.point("layers.0.attn").ref == g.point("layers.0.attn:0").ref
    assert g.point("layers.0.attn").ref.node == "layers.0.getitem"
    for name in ("layers.0.getitem", "layers.0.add", "layers.0.mlp.1", "layers.0", "layers.1.add_1",
                 "attn.softmax", "attn.matmul_1", "attn", "add", "norm"):  # fmt: skip
        assert name in g.names(), name
    assert g.point("layers.1").ref.node == "layers.1.add_1"
    assert g.point("attn").ref.node == "attn.proj"
    # A shape is a point (torchvision names it) that only its exact name selects.
    assert g.node("attn.getattr").outputs[0] == TensorSpec((3,), DType.INT64)
    assert g.point("attn.getattr").exact_only


def test_functional_parameter_is_constant() -> None:
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(4))
            self.register_buffer("shift", torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale + self.shift + torch.tensor(1.0)

    model = Scaled()
    g = ct.trace(model, torch.randn(2, 4))
    constants = {n.name: n.op for n in g.nodes if n.kind is NodeKind.CONSTANT}
    assert constants == {"scale": "parameter", "shift": "buffer", "_tensor_constant0": "constant"}
    assert not hasattr(model, "_tensor_constant0")  # tracing left the model untouched


def test_trace_rejects_non_modules() -> None:
    with pytest.raises(TypeError, match=r"nn\.Module"):
        ct.trace(lambda x: x, torch.ones(1))
    with pytest.raises(TypeError, match=r"pass a torch\.nn\.Module"):
        ct.trace(3, torch.ones(1))
