"""Hand-built IR graphs for framework-free tests."""

from __future__ import annotations

from clouseau.ir import (
    DType,
    Graph,
    ModuleInfo,
    Node,
    NodeKind,
    OpaqueSpec,
    Ref,
    Source,
    TensorSpec,
)
from clouseau.ir.flops import OpCategory, category_attr


def f32(*shape: int) -> TensorSpec:
    return TensorSpec(shape, DType.FLOAT32)


def block_graph() -> Graph:
    """A residual block as the torch frontend names it: conv, bn, relu, add, relu_1.

    Each op carries the FLOP category the torch frontend would give it.
    """
    x = f32(2, 4, 8, 8)
    src = Source("/home/user/model.py", 12, "forward", "out = self.conv1(x)")
    nodes = (
        Node("x", NodeKind.INPUT, "input", outputs=(x,)),
        Node("conv1", NodeKind.OP, "conv2d", (Ref("x"),), (x,), "conv1", "Conv2d", "torch.nn.Conv2d", src,
             attrs=category_attr(OpCategory.CONV)),
        Node("layer1.0.conv1", NodeKind.OP, "conv2d", (Ref("conv1"),), (x,), "layer1.0.conv1", "Conv2d",
             attrs=category_attr(OpCategory.CONV)),
        Node("layer1.0.bn1", NodeKind.OP, "batchnorm2d", (Ref("layer1.0.conv1"),), (x,), "layer1.0.bn1", "BatchNorm2d",
             attrs=category_attr(OpCategory.BATCH_NORM)),
        Node("layer1.0.relu", NodeKind.OP, "relu", (Ref("layer1.0.bn1"),), (x,), "layer1.0.relu", "ReLU",
             attrs=category_attr(OpCategory.ELEMENTWISE)),
        Node("layer1.0.add", NodeKind.OP, "add", (Ref("layer1.0.relu"), Ref("conv1")), (x,), "layer1.0", "BasicBlock",
             "operator.add", attrs=category_attr(OpCategory.ELEMENTWISE)),
        Node("layer1.0.relu_1", NodeKind.OP, "relu", (Ref("layer1.0.add"),), (x,), "layer1.0.relu", "ReLU",
             aliases=((0, "layer1.0"), (0, "layer1")), attrs=category_attr(OpCategory.ELEMENTWISE)),
        Node("layer1.0.size", NodeKind.OP, "size", (Ref("layer1.0.relu_1"),), (OpaqueSpec("int"),), "layer1.0",
             "BasicBlock", attrs=(("dim", 0), *category_attr(OpCategory.FREE))),
        Node("fc", NodeKind.OP, "linear", (Ref("layer1.0.relu_1"),), (f32(2, 10),), "fc", "Linear",
             attrs=category_attr(OpCategory.MATMUL)),
        Node("output", NodeKind.OUTPUT, "output", (Ref("fc"),)),
    )  # fmt: skip
    modules = (
        ModuleInfo("", "Net", 1000),
        ModuleInfo("conv1", "Conv2d", 148),
        ModuleInfo("layer1", "Sequential", 300),
        ModuleInfo("layer1.0", "BasicBlock", 300),
        ModuleInfo("layer1.0.conv1", "Conv2d", 144),
        ModuleInfo("layer1.0.bn1", "BatchNorm2d", 8),
        ModuleInfo("layer1.0.relu", "ReLU", 0),
        ModuleInfo("fc", "Linear", 330),
    )
    return Graph(nodes, name="Net", modules=modules, meta=(("note", "hand-built"),))
