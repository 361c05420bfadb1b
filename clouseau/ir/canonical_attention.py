"""An attention's values around its kernel: q, k, v, z, and scores and pattern if eager.

A fused kernel (``scaled_dot_product_attention``) reads q, k, v and a mask; an eager
attention computes ``softmax(q @ k^T * scale + mask) @ v`` op by op. Either way the
``[batch, pos, head, d_head]`` values the model computes before and after the kernel
are found by walking the layout ops (views, transposes, rotary embeddings, repeated
key-value heads) back from its inputs and forward from its output.
"""

from __future__ import annotations

from dataclasses import dataclass

from clouseau.ir.canonical_index import (
    HEAD_SPLIT_OPS,
    KERNEL_OPS,
    LAYOUT_OPS,
    MATMUL_OPS,
    PASS_OPS,
    SOFTMAX_OPS,
    GraphIndex,
    cone,
    numel,
)
from clouseau.ir.graph import Graph, Node, NodeKind, Ref


@dataclass(frozen=True)
class Attention:
    """One attention of a block.

    ``q``, ``k``, ``v`` are what the kernel reads (``[batch, head, pos, d_head]``, or
    ``[batch*head, pos, d_head]`` for a batched matmul); ``q_heads``... are the
    ``[batch, pos, head, d_head]`` values the model computes before its kernel, where
    there is one; ``mask`` the kernel's mask. ``scores`` and ``pattern`` are set where
    the model computes them (eager attention); for a fused kernel they are computed
    beside it (:mod:`clouseau.ir.canonical_names`). ``out`` is the kernel's output
    (``[batch, head, pos, d_head]``), ``z`` its ``[batch, pos, head, d_head]`` layout
    where the model has one, and ``output`` what the attention adds to the stream.
    """

    kernel: str
    fused: bool
    q: Ref
    k: Ref
    v: Ref
    out: Ref
    output: Ref
    q_heads: Ref | None = None
    k_heads: Ref | None = None
    v_heads: Ref | None = None
    z: Ref | None = None
    scores: Ref | None = None
    pattern: Ref | None = None
    mask: Ref | None = None


def kernels(graph: Graph, index: GraphIndex) -> list[Node]:
    # Over [batch, head, query, key] (jax.nn.dot_product_attention: with a group axis);
    # a graph without shapes yet has none.
    return [
        node
        for node in graph.nodes
        if node.op in KERNEL_OPS | SOFTMAX_OPS and len(index.shape(Ref(node.name)) or ()) in (4, 5)
    ]


def kernel_in(index: GraphIndex, ref: Ref, stop: set[Ref], names: set[str]) -> Node | None:
    kernels = [
        n
        for n in cone(index, ref, stop, names)
        if n.op in KERNEL_OPS | SOFTMAX_OPS and len(index.shape(Ref(n.name)) or ()) in (4, 5)
    ]
    return kernels[-1] if kernels else None


def attention_of(index: GraphIndex, kernel: Node, output: Ref) -> Attention | None:
    if kernel.op in KERNEL_OPS:
        live = index.tensor_inputs(kernel)
        if len(live) < 3:
            return None
        q, k, v = live[:3]
        mask = live[3] if len(live) > 3 else None
        out = Ref(kernel.name)
        scores = pattern = None
        fused = True
    else:
        found = _eager(index, kernel)
        if found is None:
            return None
        q, k, v, out, scores = found
        pattern, mask, fused = Ref(kernel.name), None, False
    shape = index.shape(out)
    # A kernel in the [batch, pos, head, d_head] layout (jax's) returns z itself.
    bshd = kernel.attr("layout") == "bshd"
    heads = shape[2 if bshd else 1] if shape and len(shape) == 4 else 0
    d_head = (index.shape(q) or (0,))[-1]
    return Attention(
        kernel=kernel.name, fused=fused, q=q, k=k, v=v, out=out, output=output,
        q_heads=_heads(index, q, d_head, bshd), k_heads=_heads(index, k, d_head, bshd),
        v_heads=_heads(index, v, d_head, bshd), z=out if bshd else _z(index, out, heads),
        scores=scores, pattern=pattern, mask=mask,
    )  # fmt: skip


def _eager(index: GraphIndex, softmax: Node) -> tuple[Ref, Ref, Ref, Ref, Ref] | None:
    """q, k, v, the attention's output and its scores around an eager softmax."""
    live_in = index.live_inputs(softmax)
    if not live_in:  # a softmax of parameters or buffers alone (ConViT's positional gate)
        return None
    scores = live_in[0]
    cur = scores
    for _ in range(12):  # back through scaling, softcapping and masking to q @ k^T
        node = index.node(cur)
        if node.op in MATMUL_OPS:
            live = index.live_inputs(node)
            if len(live) < 2:
                return None
            q, k = live[-2], live[-1]
            break
        live = index.live_inputs(node)
        if not live:
            return None
        cur = max(live, key=lambda r: numel(index, r))
    else:
        return None
    cur = Ref(softmax.name)
    for _ in range(6):  # forward through casts and dropout to pattern @ v
        users = [u for u in index.users.get(cur.node, ()) if u.kind is NodeKind.OP]
        mm = [u for u in users if u.op in MATMUL_OPS]
        if mm:
            live = index.live_inputs(mm[0])
            v = next((r for r in live if r != cur), None)
            if v is None:
                return None
            return q, k, v, _four_d(index, Ref(mm[0].name)), scores
        passes = [u for u in users if u.op in PASS_OPS]
        if not passes:
            return None
        cur = Ref(passes[0].name)
    return None


def _four_d(index: GraphIndex, ref: Ref) -> Ref:
    """A ``[batch*head, pos, d]`` result's ``[batch, head, pos, d]`` view, when the model has it."""
    if len(index.shape(ref) or ()) == 4:
        return ref
    for user in index.users.get(ref.node, ()):
        if user.op in ("view", "reshape") and len(index.shape(Ref(user.name)) or ()) == 4:
            return Ref(user.name)
    return ref


def _heads(index: GraphIndex, ref: Ref, d_head: int, bshd: bool) -> Ref | None:
    """A kernel input's ``[batch, pos, head, d_head]`` value: itself in layout ``bshd``."""
    return (_head_view(index, ref, d_head) or ref) if bshd else _head_view(index, ref, d_head)


def _head_view(index: GraphIndex, ref: Ref, d_head: int) -> Ref | None:
    """The ``[batch, pos, head, d_head]`` value a kernel input is a layout of, if any."""
    shape = index.shape(ref)
    if shape is None or len(shape) not in (3, 4, 5):
        return None
    cur = ref
    for _ in range(16):
        node = index.node(cur)
        live = index.live_inputs(node)
        if not live:
            return None
        first = max(live, key=lambda r: numel(index, r))
        out_shape = index.shape(cur) or ()
        in_shape = index.shape(first) or ()
        if (
            node.op in HEAD_SPLIT_OPS
            and len(out_shape) == 4
            and len(in_shape) == (5 if node.op == "select" else 3)
            and out_shape[-1] == d_head
        ):
            return cur
        if node.op not in LAYOUT_OPS:
            return None
        cur = first
    return None


def _z(index: GraphIndex, out: Ref, heads: int) -> Ref | None:
    """The ``[batch, pos, head, d_head]`` layout of a kernel's output, if the model has one."""
    shape = index.shape(out)
    if shape is None or len(shape) != 4:
        return None
    want = (shape[0], shape[2], shape[1], shape[3])
    cur = out
    for _ in range(4):
        users = [u for u in index.users.get(cur.node, ()) if u.op in LAYOUT_OPS]
        if len(users) != 1:
            return None
        cur = Ref(users[0].name)
        if index.shape(cur) == want and users[0].op in ("transpose", "permute"):
            return cur
    return None
