"""The roles of a transformer's values, inferred from the IR and its module tree.

A transformer is a list of blocks that each add an attention's and an MLP's output to a
residual stream. :func:`infer_roles` finds them without a table per architecture:

- a *block list* is a module whose children ``0 .. n-1`` share one class and each
  hold an attention kernel (``scaled_dot_product_attention`` or a ``softmax`` over
  ``[batch, head, query, key]``);
- a block's *residual adds* are the ``add`` nodes of the block's hidden shape that read
  the residual stream (the block's input, or the last residual add, also through a
  post-norm and through dtype casts, dropouts and views of the same shape);
- what a residual add adds to the stream is an *attention output* when an attention
  kernel computed it since the stream (the first is self-attention, a second is
  cross-attention), else an *MLP output*; a parallel block's one add of
  ``attn + mlp + resid`` is split into its summands;
- the MLP's activation (an activation op or module) gives ``mlp.pre`` (its input) and
  ``mlp.post`` (its output, times the up-projection in a gated MLP);
- the embedding is the ``embedding`` op (or patch convolution) the first block's stream
  comes from, the final norm the norm module that reads the last block's stream, and
  the logits the projection after it that the model returns.

Nothing here knows a framework: it reads op names, shapes, module paths and classes.
:mod:`clouseau.ir.canonical_names` turns the roles into point names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from clouseau.ir.canonical_attention import Attention, attention_of, kernel_in, kernels
from clouseau.ir.canonical_index import (
    ACT_MODULE,
    ACT_OPS,
    ADD_OPS,
    LINEAR_OPS,
    NORM_OPS,
    GraphIndex,
    ancestors,
    cone,
    flat_same,
    inside,
)
from clouseau.ir.graph import Graph, Node, NodeKind, Ref


#: Ops that pass a value on unchanged (same shape) for the purpose of finding roles.
@dataclass(frozen=True)
class Block:
    """One block: its residual stream, attentions and MLP."""

    index: int
    path: str
    resid_pre: Ref
    resid_post: Ref
    attentions: tuple[Attention, ...]
    resid_mid: Ref | None = None
    mlp_out: Ref | None = None
    mlp_pre: Ref | None = None
    mlp_post: Ref | None = None


@dataclass(frozen=True)
class Stack:
    """A block list with what comes before and after it (embedding, final norm)."""

    path: str
    blocks: tuple[Block, ...]
    embed: Ref | None = None
    pos_embed: Ref | None = None
    ln_final: Ref | None = None


@dataclass(frozen=True)
class Roles:
    """The stacks of a model (one, or an encoder's and a decoder's) and its logits."""

    stacks: tuple[Stack, ...]
    logits: Ref | None = None
    unembed: str = ""  # the node that projects to the vocabulary


def infer_roles(graph: Graph) -> Roles:
    """The transformer roles of ``graph``'s values; empty when it has no block list."""
    index = GraphIndex(graph)
    stacks = []
    for path, children in _block_lists(graph, index):
        blocks = []
        for i, child in enumerate(children):
            block = _block(index, i, child)
            if block is None:
                break
            blocks.append(block)
        if blocks:
            stacks.append(_stack(index, path, tuple(blocks)))
    stacks.sort(key=lambda s: index.order[s.blocks[0].resid_post.node])
    if not stacks:
        return Roles(())
    logits, unembed = _logits(index, stacks[-1])
    return Roles(tuple(stacks), logits, unembed)


def _block_lists(graph: Graph, index: GraphIndex) -> list[tuple[str, tuple[str, ...]]]:
    """Module lists whose children share a class and each hold an attention kernel."""
    numbered = re.compile(r"^(?:(.*)\.)?(\d+)$")
    groups: dict[str, dict[int, str]] = {}
    for module in graph.modules:
        found = numbered.match(module.path)
        if found:
            groups.setdefault(found.group(1) or "", {})[int(found.group(2))] = module.type
    found_kernels = kernels(graph, index)
    lists = []
    for prefix, kids in groups.items():
        if sorted(kids) != list(range(len(kids))) or len(set(kids.values())) != 1:
            continue
        paths = tuple(f"{prefix}.{i}" if prefix else str(i) for i in range(len(kids)))
        if all(any(inside(k, p) for k in found_kernels) for p in paths):
            lists.append((prefix, paths))
    # A block list inside another one's block (a block of blocks) is not a stack.
    return [
        (prefix, paths)
        for prefix, paths in lists
        if not any(
            other != prefix and any(prefix.startswith(p + ".") for p in other_paths)
            for other, other_paths in lists
        )
    ]


def _block(index: GraphIndex, number: int, path: str) -> Block | None:
    post = index.module_output(path)
    if post is None:
        return None
    hidden = index.shape(post)
    members = [n for n in index.graph.nodes if inside(n, path) and n.kind is NodeKind.OP]
    names = {n.name for n in members}
    pre = _resid_pre(index, members, names, hidden)
    if pre is None:
        return None
    adds = _residual_adds(index, members, pre, hidden)
    if not adds:
        return None
    attentions: list[Attention] = []
    mlp: Ref | None = None
    mid: Ref | None = None
    seen: set[Ref] = set(index.passthrough(pre))
    for add, stream, added in adds:
        for leaf in _summands(index, added, hidden, names):
            kernel = kernel_in(index, leaf, seen, names)
            if kernel is not None:
                attention = attention_of(index, kernel, leaf)
                if attention is not None:
                    attentions.append(attention)
            elif mlp is None:
                mlp = leaf
                if len(adds) > 1 and add is not adds[0][0]:
                    mid = stream
        seen |= index.passthrough(Ref(add.name)) | _post_norms(index, Ref(add.name))
    if not attentions:
        return None
    if mid is None and len(adds) > 1:
        mid = adds[1][1]
    pre_act, post_act = _mlp_activation(index, mlp, seen, names) if mlp else (None, None)
    return Block(number, path, pre, post, tuple(attentions), mid, mlp, pre_act, post_act)


def _resid_pre(
    index: GraphIndex, members: list[Node], names: set[str], hidden: tuple[int, ...] | None
) -> Ref | None:
    """The value the block reads from outside that one of its residual adds adds to."""
    adds = [n for n in members if n.op in ADD_OPS]
    read_by_adds = {r for n in adds for r in n.inputs}
    for node in members:
        for ref in index.tensor_inputs(node):
            if ref.node in names or index.shape(ref) != hidden or ref.node in index.static:
                continue
            if index.passthrough(ref) & read_by_adds:
                return ref
    return None


def _residual_adds(
    index: GraphIndex, members: list[Node], pre: Ref, hidden: tuple[int, ...] | None
) -> list[tuple[Node, Ref, Ref]]:
    """(add node, the stream it reads, what it adds) in execution order."""
    stream = index.passthrough(pre)
    found = []
    for node in members:
        if node.op not in ADD_OPS or not flat_same(index.shape(Ref(node.name)), hidden):
            continue
        live = index.live_inputs(node)
        if len(live) != 2 or any(not flat_same(index.shape(r), hidden) for r in live):
            continue
        a, b = live
        if (a in stream) == (b in stream):
            continue
        s, c = (a, b) if a in stream else (b, a)
        found.append((node, s, c))
        out = Ref(node.name)
        # A post-norm block (BERT) carries the normalized sum on as its stream.
        stream = index.passthrough(out) | _post_norms(index, out)
    return found


def _post_norms(index: GraphIndex, ref: Ref) -> set[Ref]:
    found: set[Ref] = set()
    for member in index.passthrough(ref):
        for user in index.users.get(member.node, ()):
            if "norm" in user.module_type.lower():
                out = index.module_output(user.module)
                if out is not None and flat_same(index.shape(out), index.shape(ref)):
                    found |= index.passthrough(out)
    return found


def _summands(
    index: GraphIndex, ref: Ref, hidden: tuple[int, ...] | None, names: set[str]
) -> list[Ref]:
    """A parallel block's ``attn + mlp`` split into its terms (the value itself else)."""
    src = index.source(ref)
    node = index.node(src)
    live = index.live_inputs(node)
    if (
        node.op in ADD_OPS
        and node.name in names
        and len(live) == 2
        and all(flat_same(index.shape(r), hidden) for r in live)
    ):
        return [leaf for r in live for leaf in _summands(index, r, hidden, names)]
    return [ref]


def _mlp_activation(
    index: GraphIndex, mlp: Ref, stop: set[Ref], names: set[str]
) -> tuple[Ref | None, Ref | None]:
    """The MLP's pre- and post-activation values."""
    computed = cone(index, mlp, stop, names)
    acts: list[tuple[Ref, Ref]] = []
    inner: set[str] = set()
    for node in computed:
        if node.name in inner:
            continue
        module_act = (
            node.module_type
            and ACT_MODULE.search(node.module_type)
            and any(a in (node.module, f"{node.module}:0") for _, a in node.aliases)
        )
        if module_act:
            members = [n for n in computed if n.module == node.module]
            inner |= {n.name for n in members}
            outside = [
                r
                for n in members
                for r in index.live_inputs(n)
                if index.node(r).module != node.module
            ]
            if outside:
                acts.append((outside[0], Ref(node.name)))
        elif node.op in ACT_OPS:
            live = index.live_inputs(node)
            if live:
                acts.append((live[0], Ref(node.name)))
    if not acts:
        return None, None
    pre, post = acts[-1]
    for user in index.users.get(post.node, ()):
        live = index.live_inputs(user)
        if user.op == "mul" and len(live) == 2 and index.shape(Ref(user.name)) == index.shape(post):
            return pre, Ref(user.name)
    return pre, post


def _stack(index: GraphIndex, path: str, blocks: tuple[Block, ...]) -> Stack:
    embed, pos = _embeddings(index, blocks[0].resid_pre)
    return Stack(path, blocks, embed, pos, _final_norm(index, blocks[-1].resid_post))


def _embeddings(index: GraphIndex, pre: Ref) -> tuple[Ref | None, Ref | None]:
    """The token (or patch) embedding and the learned position embedding of a stack."""
    cone = ancestors(index, pre)
    # A table lookup: an embedding op, or (JAX) a gather or take (nnx.Embed) from a
    # parameter by the input ids.
    lookups = [
        n
        for n in cone
        if n.op == "embedding"
        or (n.op in ("gather", "take") and n.inputs and n.inputs[0].node in index.static)
    ]
    token = next(
        (n for n in lookups if n.name not in index.static and _reads_input(index, n)), None
    )
    if token is None:
        conv = next((n for n in cone if n.op.startswith("conv")), None)
        if conv is None:
            return None, None
        parent = conv.module.rsplit(".", 1)[0] if "." in conv.module else conv.module
        return index.module_output(parent) or Ref(conv.name), None
    embed = _module_value(index, token)
    others = [n for n in lookups if n is not token]
    pos = next((n for n in others if "pos" in n.module.lower() or "wpe" in n.module), None)
    return embed, (_module_value(index, pos) if pos is not None else None)


def _module_value(index: GraphIndex, node: Node) -> Ref:
    """The output of the module ``node`` belongs to (a scaled embedding), else the node."""
    out = index.module_output(node.module) if node.module else None
    return out if out is not None else Ref(node.name)


def _reads_input(index: GraphIndex, node: Node) -> bool:
    return any(n.kind is NodeKind.INPUT for n in ancestors(index, Ref(node.name)))


def _final_norm(index: GraphIndex, post: Ref) -> Ref | None:
    for member in index.passthrough(post):
        for user in index.users.get(member.node, ()):
            if "norm" in user.module_type.lower() or user.op in NORM_OPS:
                out = index.module_output(user.module)
                if out is not None and index.shape(out) == index.shape(post):
                    return out
    return None


def _logits(index: GraphIndex, stack: Stack) -> tuple[Ref | None, str]:
    """The model's logits: a projection of the final stream off the hidden size."""
    start = stack.ln_final or stack.blocks[-1].resid_post
    hidden = index.shape(start)
    if hidden is None or len(hidden) < 2:
        return None, ""
    returned = _returned(index)
    downstream = {start.node}
    for node in index.graph.nodes[index.order[start.node] + 1 :]:
        if not any(r.node in downstream for r in node.inputs):
            continue
        downstream.add(node.name)
        shape = index.shape(Ref(node.name)) if node.outputs else None
        if (
            node.op in LINEAR_OPS
            and shape is not None
            and len(shape) == len(hidden)
            and shape[0] == hidden[0]  # the positions may be sliced (logits_to_keep)
            and shape[-1] != hidden[-1]
        ):
            return _to_output(index, Ref(node.name), returned), node.name
    return None, ""


def _returned(index: GraphIndex) -> set[Ref]:
    out = index.graph.output
    return set(out.inputs) if out is not None else set()


def _to_output(index: GraphIndex, ref: Ref, returned: Iterable[Ref]) -> Ref:
    """Forward through same-shape elementwise ops (final softcapping) to what is returned."""
    returned = set(returned)
    cur = ref
    for _ in range(6):
        if cur in returned:
            return cur
        users = [u for u in index.users.get(cur.node, ()) if u.kind is NodeKind.OP]
        if len(users) != 1 or index.shape(Ref(users[0].name)) != index.shape(cur):
            return _projection_output(index, ref)
        cur = Ref(users[0].name)
    return cur if cur in returned else _projection_output(index, ref)


def _projection_output(index: GraphIndex, ref: Ref) -> Ref:
    """What the projection's module returns (its bias added): the logits where the model's
    return does not show them (a model called in the body of a JAX ``lax.scan``)."""
    module = index.node(ref).module
    out = index.module_output(module) if module else None
    return out if out is not None and index.shape(out) == index.shape(ref) else ref
