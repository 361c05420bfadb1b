"""Hand-built IR graphs named as the torch frontend names them (no framework needed)."""

from __future__ import annotations

from clouseau.ir import DType, Graph, ModuleInfo, Node, NodeKind, Ref, TensorSpec
from tests.ir.graphs import f32


class _Nodes:
    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def add(self, name: str, op: str, inputs: tuple[str, ...], spec: TensorSpec, module: str = "", mtype: str = "",
            aliases: tuple[str, ...] = ()) -> str:  # fmt: skip
        self.nodes.append(
            Node(name, NodeKind.OP, op, tuple(Ref(i) for i in inputs), (spec,), module, mtype,
                 aliases=tuple((0, a) for a in aliases))
        )  # fmt: skip
        return name


def _block(
    b: _Nodes, path: str, x: str, cin: int, cout: int, size: int, down: bool, last: bool
) -> str:
    s = f32(2, cout, size, size)
    h = b.add(f"{path}.conv1", "conv2d", (x,), s, f"{path}.conv1", "Conv2d")
    h = b.add(f"{path}.bn1", "batch_norm", (h,), s, f"{path}.bn1", "BatchNorm2d")
    h = b.add(f"{path}.relu", "relu", (h,), s, f"{path}.relu", "ReLU")
    h = b.add(f"{path}.conv2", "conv2d", (h,), s, f"{path}.conv2", "Conv2d")
    h = b.add(f"{path}.bn2", "batch_norm", (h,), s, f"{path}.bn2", "BatchNorm2d")
    skip = x
    if down:
        skip = b.add(f"{path}.downsample.0", "conv2d", (x,), s, f"{path}.downsample.0", "Conv2d")
        skip = b.add(f"{path}.downsample.1", "batch_norm", (skip,), s, f"{path}.downsample.1", "BatchNorm2d",
                     aliases=(f"{path}.downsample",))  # fmt: skip
    h = b.add(f"{path}.add", "add", (h, skip), s, path, "BasicBlock")
    layer = path.rsplit(".", 1)[0]
    return b.add(f"{path}.relu_1", "relu", (h,), s, f"{path}.relu", "ReLU",
                 aliases=(path, layer) if last else (path,))  # fmt: skip


def resnet_graph() -> Graph:
    """conv1/bn1/relu stem, layer1 (two identical blocks), layer2 (downsample + block), fc."""
    b = _Nodes()
    b.nodes.append(Node("x", NodeKind.INPUT, "input", outputs=(f32(2, 3, 16, 16),)))
    h = b.add("conv1", "conv2d", ("x",), f32(2, 8, 16, 16), "conv1", "Conv2d")
    h = b.add("bn1", "batch_norm", (h,), f32(2, 8, 16, 16), "bn1", "BatchNorm2d")
    h = b.add("relu", "relu", (h,), f32(2, 8, 16, 16), "relu", "ReLU")
    h = _block(b, "layer1.0", h, 8, 8, 16, False, False)
    h = _block(b, "layer1.1", h, 8, 8, 16, False, True)
    h = _block(b, "layer2.0", h, 8, 16, 8, True, False)
    h = _block(b, "layer2.1", h, 16, 16, 8, False, True)
    h = b.add(
        "avgpool", "adaptive_avg_pool2d", (h,), f32(2, 16, 1, 1), "avgpool", "AdaptiveAvgPool2d"
    )
    h = b.add("flatten", "flatten", (h,), f32(2, 16))
    h = b.add("fc", "linear", (h,), f32(2, 10), "fc", "Linear")
    b.nodes.append(Node("output", NodeKind.OUTPUT, "output", (Ref(h),)))
    modules = [ModuleInfo("", "ResNet"), ModuleInfo("conv1", "Conv2d"), ModuleInfo("bn1", "BatchNorm2d"),
               ModuleInfo("relu", "ReLU")]  # fmt: skip
    for layer, blocks in (("layer1", ("0", "1")), ("layer2", ("0", "1"))):
        modules.append(ModuleInfo(layer, "Sequential"))
        for blk in blocks:
            p = f"{layer}.{blk}"
            modules += [ModuleInfo(p, "BasicBlock")] + [
                ModuleInfo(f"{p}.{c}", t) for c, t in
                (("conv1", "Conv2d"), ("bn1", "BatchNorm2d"), ("relu", "ReLU"), ("conv2", "Conv2d"),
                 ("bn2", "BatchNorm2d"))
            ]  # fmt: skip
    modules += [ModuleInfo("layer2.0.downsample", "Sequential"), ModuleInfo("layer2.0.downsample.0", "Conv2d"),
                ModuleInfo("layer2.0.downsample.1", "BatchNorm2d"), ModuleInfo("avgpool", "AdaptiveAvgPool2d"),
                ModuleInfo("fc", "Linear")]  # fmt: skip
    return Graph(tuple(b.nodes), name="ResNet", modules=tuple(modules))


def transformer_graph(layers: int = 12, tokens: int = 16, width: int = 64) -> Graph:
    """A pre-norm transformer encoder of ``layers`` identical blocks, as fx would name it."""
    b = _Nodes()
    s = f32(2, tokens, width)
    b.nodes.append(
        Node("x", NodeKind.INPUT, "input", outputs=(TensorSpec((2, tokens), DType.INT64),))
    )
    h = b.add("embed", "embedding", ("x",), s, "embed", "Embedding")
    modules = [
        ModuleInfo("", "Transformer"),
        ModuleInfo("embed", "Embedding"),
        ModuleInfo("layers", "ModuleList"),
    ]
    for i in range(layers):
        p = f"layers.{i}"
        modules += [
            ModuleInfo(p, "Block"),
            ModuleInfo(f"{p}.attn", "Attention"),
            ModuleInfo(f"{p}.mlp", "MLP"),
        ]
        n = b.add(f"{p}.ln1", "layer_norm", (h,), s, f"{p}.ln1", "LayerNorm")
        q = b.add(
            f"{p}.attn.qkv", "linear", (n,), f32(2, tokens, 3 * width), f"{p}.attn.qkv", "Linear"
        )
        a = b.add(
            f"{p}.attn.sdpa", "scaled_dot_product_attention", (q,), s, f"{p}.attn", "Attention"
        )
        a = b.add(
            f"{p}.attn.proj", "linear", (a,), s, f"{p}.attn.proj", "Linear", aliases=(f"{p}.attn",)
        )
        h = b.add(f"{p}.add", "add", (h, a), s, p, "Block")
        n = b.add(f"{p}.ln2", "layer_norm", (h,), s, f"{p}.ln2", "LayerNorm")
        m = b.add(
            f"{p}.mlp.fc1", "linear", (n,), f32(2, tokens, 4 * width), f"{p}.mlp.fc1", "Linear"
        )
        m = b.add(f"{p}.mlp.gelu", "gelu", (m,), f32(2, tokens, 4 * width), f"{p}.mlp", "MLP")
        m = b.add(
            f"{p}.mlp.fc2", "linear", (m,), s, f"{p}.mlp.fc2", "Linear", aliases=(f"{p}.mlp",)
        )
        h = b.add(f"{p}.add_1", "add", (h, m), s, p, "Block", aliases=(p,))
    h = b.add("head", "linear", (h,), f32(2, tokens, 100), "head", "Linear")
    b.nodes.append(Node("output", NodeKind.OUTPUT, "output", (Ref(h),)))
    return Graph(tuple(b.nodes), name="Transformer", modules=tuple(modules))
