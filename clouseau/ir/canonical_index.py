"""Look-ups over one graph that role inference needs: consumers, specs, pass-throughs.

The op-name sets say which ops keep a value the same for finding roles (a cast, a
dropout, a same-size view), which add, which are attention kernels, matmuls, linear
projections and activations; they are spelled as both frontends name ops.
"""

from __future__ import annotations

import re

from clouseau.ir.graph import Graph, Node, NodeKind, Ref, TensorSpec

PASS_OPS = frozenset(
    {"dropout", "alias", "to", "clone", "contiguous", "type_as", "detach", "identity",
     "view", "reshape", "_to_copy", "float", "dropout_", "feature_dropout"}
)  # fmt: skip


ADD_OPS = frozenset({"add", "add_", "iadd"})


# jax.nn.dot_product_attention reads and returns [batch, pos, head, d_head] (attr layout).
KERNEL_OPS = frozenset({"scaled_dot_product_attention", "dot_product_attention"})


SOFTMAX_OPS = frozenset({"softmax", "_softmax", "softmax_"})


MATMUL_OPS = frozenset({"matmul", "bmm", "baddbmm", "einsum", "dot_general"})


LINEAR_OPS = frozenset({"linear", "addmm", "matmul", "mm", "conv1d", "dot_general"})


ACT_OPS = frozenset(
    {"gelu", "relu", "silu", "gelu_tanh", "quick_gelu", "elu", "leaky_relu", "mish",
     "hardswish", "relu_", "silu_", "gelu_"}
)  # fmt: skip


ACT_MODULE = re.compile(r"gelu|relu|silu|swish|activation|mish", re.IGNORECASE)


NORM_OPS = frozenset({"layernorm", "layer_norm", "rms_norm", "group_norm", "native_layer_norm"})


LAYOUT_OPS = frozenset(
    {"transpose", "permute", "contiguous", "clone", "to", "alias", "expand", "unsqueeze",
     "reshape", "view", "cat", "mul", "add", "neg", "detach", "type_as", "_to_copy",
     "repeat_interleave", "flatten"}
)  # fmt: skip


HEAD_SPLIT_OPS = frozenset({"view", "reshape", "unflatten", "_unsafe_view", "select"})


class GraphIndex:
    """Look-ups over one graph: nodes, consumers, specs, module members."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.order = {n.name: i for i, n in enumerate(graph.nodes)}
        self.users: dict[str, list[Node]] = {}
        for node in graph.nodes:
            for ref in node.inputs:
                self.users.setdefault(ref.node, []).append(node)
        self.static = graph._static
        self.outputs: dict[str, Ref] = {}
        for node in graph.nodes:
            if node.kind is not NodeKind.OP:
                continue
            if node.name == node.module:
                self.outputs.setdefault(node.name, Ref(node.name))
            for i, alias in node.aliases:
                path = alias.removesuffix(":0")
                self.outputs.setdefault(path, Ref(node.name, i))

    def node(self, ref: Ref | str) -> Node:
        return self.graph.node(ref if isinstance(ref, str) else ref.node)

    def spec(self, ref: Ref) -> TensorSpec | None:
        node = self.node(ref)
        if ref.index >= len(node.outputs):
            return None
        spec = node.outputs[ref.index]
        return spec if isinstance(spec, TensorSpec) else None

    def shape(self, ref: Ref) -> tuple[int, ...] | None:
        spec = self.spec(ref)
        return spec.shape if spec is not None else None

    def tensor_inputs(self, node: Node) -> list[Ref]:
        return [r for r in node.inputs if self.spec(r) is not None]

    def live_inputs(self, node: Node) -> list[Ref]:
        """Tensor inputs that depend on the model's inputs (not parameters alone)."""
        return [r for r in self.tensor_inputs(node) if r.node not in self.static]

    def module_output(self, path: str) -> Ref | None:
        """The value a module returns (its first tensor when it returns several)."""
        return self.outputs.get(path)

    def passthrough(self, ref: Ref) -> set[Ref]:
        """``ref`` and what passes it on unchanged (casts, dropouts, same-shape views)."""
        shape = self.shape(ref)
        found = {ref}
        todo = [ref]
        while todo:
            cur = todo.pop()
            for user in self.users.get(cur.node, ()):
                out = Ref(user.name)
                live = self.live_inputs(user)
                if (
                    user.op in PASS_OPS
                    and live[:1] == [cur]
                    and flat_same(self.shape(out), shape)
                    and out not in found
                ):
                    found.add(out)
                    todo.append(out)
        return found

    def source(self, ref: Ref) -> Ref:
        """Back through pass-through ops to the value they pass on."""
        while True:
            node = self.node(ref)
            live = self.live_inputs(node)
            if (
                node.op in PASS_OPS
                and len(live) == 1
                and flat_same(self.shape(live[0]), self.shape(ref))
            ):
                ref = live[0]
            else:
                return ref


def flat_same(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> bool:
    """One stream's shapes: equal, or with the batch dims flattened (OPT's MLP)."""
    if a is None or b is None or not a or not b:
        return a == b
    return a[-1] == b[-1] and _prod(a) == _prod(b)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def numel(index: GraphIndex, ref: Ref) -> int:
    spec = index.spec(ref)
    return spec.numel if spec is not None else 0


def cone(index: GraphIndex, ref: Ref, stop: set[Ref], names: set[str]) -> list[Node]:
    """The block's nodes that ``ref`` is computed from, back to the stream ``stop``."""
    found: dict[str, Node] = {}
    todo = [ref]
    while todo:
        cur = todo.pop()
        if cur in stop or cur.node not in names or cur.node in found:
            continue
        node = index.node(cur)
        found[node.name] = node
        todo.extend(node.inputs)
    return sorted(found.values(), key=lambda n: index.order[n.name])


def ancestors(index: GraphIndex, ref: Ref) -> list[Node]:
    found: dict[str, Node] = {}
    todo = [ref.node]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        node = index.node(name)
        found[name] = node
        todo.extend(r.node for r in node.inputs)
    return sorted(found.values(), key=lambda n: index.order[n.name])


def inside(node: Node, path: str) -> bool:
    return node.module == path or node.module.startswith(path + ".")
