"""Points computed in the graph: values the model never materializes, from values it does.

A computed point is one IR node (op :data:`COMPUTED`) that reads model values and holds
a small *program* as its subgraph: input nodes ``in0 .. inN`` (its inputs, in order),
then ops of the framework-neutral set :class:`Op`, then an output node. Each frontend
lowers the ops (``clouseau.capture.torch.lowering.computed``); it does so only for a computed
point a save reads, so an unselected one costs nothing, and a computed point never
feeds the model: its outputs stay bitwise.

:class:`Program` builds programs with their shapes::

    p = Program((q_spec, k_spec))
    s = p.matmul(p.input(0), p.transpose(p.input(1), -2, -1))
    node = p.node("blocks.0.attn.scores", p.scale(s, 0.125), inputs=(q_ref, k_ref))

Besides the arithmetic (matmul, add, mul, softmax, norms, reshape and transpose,
indexing), :attr:`Op.REPLAY` applies a run of the model's own nodes to another value
(the final norm and unembedding in the logit lens), so the result is what the model
itself computes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from clouseau.ir.graph import AttrValue, Graph, Node, NodeKind, Ref, TensorSpec

#: The op of a computed point's node.
COMPUTED = "computed"


class Op(enum.Enum):
    """The framework-neutral operations of a computed point's program."""

    MATMUL = "matmul"  # batched, broadcasting: (..., n, k) @ (..., k, m)
    ADD = "add"  # a + b, or a + attr scalar
    MUL = "mul"  # a * b, or a * attr scalar
    TANH = "tanh"
    SOFTMAX = "softmax"  # over attr axis, in float32, cast back; a row of only -inf is 0
    LAYER_NORM = "layer_norm"  # over the last axis; inputs x[, weight[, bias]]; attr eps
    RMS_NORM = "rms_norm"  # over the last axis; inputs x[, weight]; attr eps
    RESHAPE = "reshape"  # to attr shape
    TRANSPOSE = "transpose"  # swap attr axes a, b
    INDEX = "index"  # attr axis, attr index: one slice, the axis dropped
    SUM = "sum"  # over attr axis
    REPEAT = "repeat"  # each slice attr times along attr axis (grouped-query heads)
    # Fill values are strings float() reads ("-inf"): graph files stay strict JSON.
    MASK_FILL = "mask_fill"  # x where the boolean mask is true, else attr value
    CAUSAL_FILL = "causal_fill"  # x on and below diagonal attr offset, else attr value
    KEEP = "keep"  # x with every slice along attr axis zeroed but attr index (-1: all)
    STACK = "stack"  # the inputs stacked along a new axis attr axis
    REPLAY = "replay"  # the model's nodes attr nodes, attr source replaced by the input


@dataclass
class Program:
    """A program under construction: its ops, with the shapes they produce."""

    inputs: Sequence[TensorSpec]
    _nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i, spec in enumerate(self.inputs):
            self._nodes.append(Node(f"in{i}", NodeKind.INPUT, "input", outputs=(spec,)))

    def input(self, index: int) -> Ref:
        return Ref(f"in{index}")

    def spec(self, ref: Ref) -> TensorSpec:
        spec = next(n for n in self._nodes if n.name == ref.node).outputs[0]
        assert isinstance(spec, TensorSpec)
        return spec

    def op(self, op: Op, inputs: Sequence[Ref], shape: Sequence[int], /, **attrs: AttrValue) -> Ref:
        """Append ``op`` on ``inputs`` producing ``shape`` (the dtype of the first input)."""
        spec = TensorSpec(tuple(shape), self.spec(inputs[0]).dtype)
        name = f"{op.value}_{len(self._nodes)}"
        node = Node(name, NodeKind.OP, op.value, tuple(inputs), (spec,), attrs=tuple(attrs.items()))
        self._nodes.append(node)
        return Ref(name)

    def transpose(self, x: Ref, a: int, b: int) -> Ref:
        shape = list(self.spec(x).shape)
        a, b = a % len(shape), b % len(shape)
        shape[a], shape[b] = shape[b], shape[a]
        return self.op(Op.TRANSPOSE, (x,), shape, a=a, b=b)

    def matmul(self, x: Ref, y: Ref) -> Ref:
        xs, ys = self.spec(x).shape, self.spec(y).shape
        batch = _broadcast(xs[:-2], ys[:-2])
        return self.op(Op.MATMUL, (x, y), (*batch, xs[-2], ys[-1]))

    def scale(self, x: Ref, factor: float) -> Ref:
        return self.op(Op.MUL, (x,), self.spec(x).shape, scalar=float(factor))

    def add(self, x: Ref, y: Ref) -> Ref:
        return self.op(Op.ADD, (x, y), _broadcast(self.spec(x).shape, self.spec(y).shape))

    def reshape(self, x: Ref, shape: Sequence[int]) -> Ref:
        return self.op(Op.RESHAPE, (x,), shape, shape=tuple(shape))

    def softmax(self, x: Ref, axis: int = -1) -> Ref:
        return self.op(Op.SOFTMAX, (x,), self.spec(x).shape, axis=axis)

    def repeat(self, x: Ref, times: int, axis: int) -> Ref:
        shape = list(self.spec(x).shape)
        shape[axis] *= times
        return self.op(Op.REPEAT, (x,), shape, times=times, axis=axis)

    def mask_fill(self, x: Ref, mask: Ref, value: str) -> Ref:
        return self.op(Op.MASK_FILL, (x, mask), self.spec(x).shape, value=value)

    def causal_fill(self, x: Ref, value: str, offset: int = 0) -> Ref:
        return self.op(Op.CAUSAL_FILL, (x,), self.spec(x).shape, value=value, offset=offset)

    def replay(self, x: Ref, nodes: Sequence[str], source: str, shape: Sequence[int]) -> Ref:
        return self.op(Op.REPLAY, (x,), shape, nodes=tuple(nodes), source=source)

    def node(
        self,
        name: str,
        out: Ref,
        *,
        inputs: Sequence[Ref],
        module: str = "",
        attrs: tuple[tuple[str, AttrValue], ...] = (),
    ) -> Node:
        """The computed point ``name``: this program's value ``out`` of model values ``inputs``
        (``attrs``: what a pass needs to know of it besides its program)."""
        spec = self.spec(out)
        program = Graph(
            nodes=(*self._nodes, Node("out", NodeKind.OUTPUT, "output", inputs=(out,))),
            name=name,
        )
        return Node(
            name=name,
            kind=NodeKind.OP,
            op=COMPUTED,
            inputs=tuple(inputs),
            outputs=(spec,),
            module=module,
            # Computing it costs work: a bare "*" does not select it (selection.NAMED).
            attrs=(("point", "named"), *attrs),
            subgraphs=(program,),
        )


def is_computed(node: Node) -> bool:
    """Whether ``node`` is a computed point (its value comes from its program)."""
    return node.kind is NodeKind.OP and node.op == COMPUTED


def program_of(node: Node) -> Graph:
    """The program of a computed point."""
    return node.subgraphs[0]


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(x if y == 1 else y for x, y in zip(a, b, strict=True))
