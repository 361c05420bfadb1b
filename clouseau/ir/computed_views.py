"""Derived views as computed points: the logit lens and per-head attention outputs.

Both replay the model's own nodes (:attr:`~clouseau.ir.computed.Op.REPLAY`) on another
value, so they compute exactly what the model computes:

- ``blocks.{i}.logit_lens``: block ``i``'s ``resid_post`` through the nodes that take the
  last block's ``resid_post`` to the logits (the final norm and the unembedding); at the
  last block it is the logits themselves.
- ``blocks.{i}.attn.head_out``: ``[batch, pos, head, d_model]``, head ``h``'s ``z`` (the
  other heads zeroed) through the output projection, less its bias: summed over heads,
  plus the bias, it is the projection's output (``attn_out`` where nothing follows it).

Each says what it is in its attrs (``view``; ``head_out`` also ``projection``, the node
whose value it stands in for): :mod:`clouseau.ir.computed_interventions` reads them.
An intervention on ``head_out`` changes what the model reads (:func:`recomposition`); one
on ``logit_lens``, which nothing in the model reads, changes only its saved value.
"""

from __future__ import annotations

from clouseau.ir.canonical_attention import Attention
from clouseau.ir.canonical_index import LINEAR_OPS
from clouseau.ir.computed import Op, Program, program_of
from clouseau.ir.graph import INSTRUMENTATION, Graph, Node, NodeKind, Ref, TensorSpec


def _spec(graph: Graph, ref: Ref) -> TensorSpec | None:
    spec = graph.node(ref.node).outputs[ref.index]
    return spec if isinstance(spec, TensorSpec) else None


def replay_chain(graph: Graph, source: Ref, target: Ref) -> tuple[str, ...] | None:
    """The nodes that compute ``target`` from ``source``, in order (None: there are none)."""
    if source.index or target.index:
        return None
    down = {source.node}
    forward: list[Node] = []
    start = False
    for node in graph.nodes:
        if node.name == source.node:
            start = True
            continue
        if start and node.kind is NodeKind.OP and any(r.node in down for r in node.inputs):
            down.add(node.name)
            forward.append(node)
        if node.name == target.node:
            break
    needed = {target.node}
    chain: list[Node] = []
    for node in reversed(forward):
        if node.name in needed:
            chain.append(node)
            needed |= {r.node for r in node.inputs}
    chain.reverse()
    # What else a chain node reads (state, an int input such as logits_to_keep) is fixed
    # for the replay: whatever depends on the source and leads to the target is in it.
    if any(node.kind in INSTRUMENTATION or not node.key for node in chain):
        return None
    if not chain or chain[-1].name != target.node:
        return None
    return tuple(n.name for n in chain)


def logit_lens(graph: Graph, name: str, *, resid: Ref, last: Ref, logits: Ref) -> Node | None:
    """``resid`` through what takes the last block's ``resid_post`` (``last``) to logits."""
    chain = replay_chain(graph, last, logits)
    spec, out = _spec(graph, resid), _spec(graph, logits)
    if chain is None or spec is None or out is None or spec != _spec(graph, last):
        return None
    program = Program((spec,))
    value = program.replay(program.input(0), chain, last.node, out.shape)
    return program.node(name, value, inputs=(resid,), attrs=(("view", "logit_lens"),))


def head_out(graph: Graph, name: str, *, attention: Attention) -> Node | None:
    """Each head's share of the attention's output projection (bias left out)."""
    source, axis = (attention.z, 2) if attention.z is not None else (attention.out, 1)
    spec = _spec(graph, source)
    end = _projection(graph, source)
    if spec is None or end is None or len(spec.shape) != 4:
        return None
    chain = replay_chain(graph, source, end)
    out = _spec(graph, end)
    if chain is None or out is None:
        return None
    p = Program((spec,))
    x = p.input(0)
    bias = p.replay(
        p.op(Op.KEEP, (x,), spec.shape, axis=axis, index=-1), chain, source.node, out.shape
    )
    minus_bias = p.scale(bias, -1.0)
    heads = []
    for h in range(spec.shape[axis]):
        kept = p.op(Op.KEEP, (x,), spec.shape, axis=axis, index=h)
        heads.append(p.add(p.replay(kept, chain, source.node, out.shape), minus_bias))
    stacked = (*out.shape[:-1], spec.shape[axis], out.shape[-1])
    value = p.op(Op.STACK, heads, stacked, axis=len(out.shape) - 1)
    return p.node(
        name, value, inputs=(source,), module=graph.node(attention.kernel).module,
        attrs=(("view", "head_out"), ("projection", end.node)),
    )  # fmt: skip


def recomposition(graph: Graph, point: Node, value: Ref, name: str) -> Node | None:
    """The projection's output that ``point`` (a computed ``head_out``) stands in for,
    from ``value`` in its place: ``value`` summed over heads, plus the projection's bias.

    The computed point ``name`` reads ``(value, z)``: ``z`` (the head_out's own input)
    only for the bias, the projection of zeros (zero where it has none), replayed as
    ``head_out`` replays it. Summed over heads, ``head_out`` plus the bias is the
    projection's output to rounding, not bitwise (a sum of per-head products, not one
    matmul). None: ``point`` is no head_out.
    """
    if point.attr("view") != "head_out":
        return None
    program = program_of(point)
    keep = next((s for s in program.nodes if s.op == Op.KEEP.value), None)
    replay = next((s for s in program.nodes if s.op == Op.REPLAY.value), None)
    spec, source = _spec(graph, value), _spec(graph, point.inputs[0])
    if keep is None or replay is None or spec is None or source is None:
        return None
    out = replay.outputs[0]
    assert isinstance(out, TensorSpec)
    p = Program((spec, source))
    summed = p.op(Op.SUM, (p.input(0),), out.shape, axis=len(out.shape) - 1)
    zeros = p.op(Op.KEEP, (p.input(1),), source.shape, axis=keep.attr("axis"), index=-1)
    nodes, start = replay.attr("nodes"), replay.attr("source")
    assert isinstance(nodes, tuple) and isinstance(start, str)
    bias = p.replay(zeros, tuple(str(n) for n in nodes), start, out.shape)
    return p.node(name, p.add(summed, bias), inputs=(value, point.inputs[0]), module=point.module)


def _projection(graph: Graph, source: Ref) -> Ref | None:
    """The output of the projection that reads ``source`` (through its reshapes)."""
    users: dict[str, list[Node]] = {}
    for node in graph.nodes:
        if node.kind is NodeKind.OP:
            for r in node.inputs:
                users.setdefault(r.node, []).append(node)
    cur = source.node
    for _ in range(8):
        nxt = users.get(cur, [])
        if len(nxt) != 1:
            return None
        node = nxt[0]
        if node.op in LINEAR_OPS:
            # A projection written as ops (Conv1D's view, addmm, view): its module's output.
            for later in graph.nodes[graph.nodes.index(node) :][:4]:
                if any(a in (node.module, f"{node.module}:0") for _, a in later.aliases):
                    return Ref(later.name)
            return Ref(node.name)
        cur = node.name
    return None
