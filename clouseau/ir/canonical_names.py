"""Canonical point names (``blocks.3.resid_post``, ``blocks.0.attn.pattern``) on a graph.

:func:`add_canonical_names` names the values whose roles :func:`~clouseau.ir.canonical.
infer_roles` found, as extra aliases of the points that already hold them (no copy), and
TransformerLens' spelling of each (``blocks.3.hook_resid_post``) beside it. A value the
model never materializes in the canonical layout (a fused kernel's attention pattern, a
``[batch, pos, head, d_head]`` view of a fused projection) is a *computed point*
(:mod:`clouseau.ir.computed`): one node that reads the model's own values and that a
frontend lowers only when a save reads it, so unselected canonical names cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from clouseau.ir.canonical import Attention, Block, Roles, Stack, infer_roles
from clouseau.ir.computed_attention import attention_point
from clouseau.ir.computed_views import head_out, logit_lens
from clouseau.ir.graph import Graph, Node, Ref

#: TransformerLens' spelling of a canonical leaf name, where it is not ``hook_<leaf>``.
TL_SPELLING = {"scores": "hook_attn_scores", "ln_final": "ln_final.hook_normalized",
               "logits": "hook_unembed"}  # fmt: skip

#: Derived views TransformerLens has no name for (no ``hook_`` alias).
_OURS = (".logit_lens", ".head_out")

#: A computed point's builder: (graph, name) -> the node that computes it (None: it cannot).
Builder = Callable[[Graph, str], Node | None]


@dataclass(frozen=True)
class Named:
    """One canonical name and the value it stands for (or how to compute it)."""

    name: str
    ref: Ref | None = None
    build: Builder | None = None  # for a computed point


def tl_alias(name: str) -> str:
    """TransformerLens' spelling of a canonical name: ``blocks.0.attn.hook_pattern``."""
    head, _, leaf = name.rpartition(".")
    spelled = TL_SPELLING.get(leaf, f"hook_{leaf}")
    return f"{head}.{spelled}" if head else spelled


def canonical_names(roles: Roles, modules: frozenset[str] = frozenset()) -> tuple[Named, ...]:
    """Every canonical name of ``roles``, in the order the model computes them.

    ``modules`` (the model's module paths) tells a decoder run alone (a generation step
    of an encoder-decoder model) by its sibling encoder: it keeps its ``decoder.`` names.
    """
    found: list[Named] = []
    for position, stack in enumerate(roles.stacks):
        prefix = _prefix(stack.path, modules, position, len(roles.stacks))
        found += _stack_names(stack, prefix)
        if stack is roles.stacks[-1] and roles.logits is not None:
            last = stack.blocks[-1].resid_post
            found += [
                Named(
                    f"{prefix}blocks.{b.index}.logit_lens",
                    build=partial(logit_lens, resid=b.resid_post, last=last, logits=roles.logits),
                )
                for b in stack.blocks
            ]
    if roles.logits is not None:
        found.append(Named("logits", roles.logits))
    return tuple(found)


def _prefix(path: str, modules: frozenset[str], position: int, count: int) -> str:
    parts = path.split(".")
    for i, part in enumerate(parts):
        other = {"encoder": "decoder", "decoder": "encoder"}.get(part)
        if other and (count > 1 or ".".join([*parts[:i], other]) in modules):
            return part + "."
    if count > 1:
        return "encoder." if position == 0 else "decoder."
    return ""


def _stack_names(stack: Stack, prefix: str) -> list[Named]:
    found = []
    for leaf, ref in (("embed", stack.embed), ("pos_embed", stack.pos_embed)):
        if ref is not None:
            found.append(Named(prefix + leaf, ref))
    for block in stack.blocks:
        found += _block_names(block, f"{prefix}blocks.{block.index}")
    if stack.ln_final is not None:
        found.append(Named(prefix + "ln_final", stack.ln_final))
    return found


def _block_names(block: Block, base: str) -> list[Named]:
    found = [Named(f"{base}.resid_pre", block.resid_pre)]
    for position, attention in enumerate(block.attentions[:2]):
        attn = "attn" if position == 0 else "cross_attn"
        found += _attention_names(attention, f"{base}.{attn}")
        found.append(Named(f"{base}.{attn}.head_out", build=partial(head_out, attention=attention)))
        found.append(Named(f"{base}.{attn}_out", attention.output))
        if position == 0 and block.resid_mid is not None:
            found.append(Named(f"{base}.resid_mid", block.resid_mid))
    for leaf, ref in (("mlp.pre", block.mlp_pre), ("mlp.post", block.mlp_post),
                      ("mlp_out", block.mlp_out)):  # fmt: skip
        if ref is not None:
            found.append(Named(f"{base}.{leaf}", ref))
    found.append(Named(f"{base}.resid_post", block.resid_post))
    return found


def _attention_names(attention: Attention, base: str) -> list[Named]:
    found = []
    held = {
        "q": attention.q_heads,
        "k": attention.k_heads,
        "v": attention.v_heads,
        "scores": attention.scores,
        "pattern": attention.pattern,
        "z": attention.z,
    }
    for what in ("q", "k", "v", "scores", "pattern", "z"):
        ref = held[what]
        if ref is not None:
            found.append(Named(f"{base}.{what}", ref))
        else:
            build = partial(_attention_point, attention=attention, what=what)
            found.append(Named(f"{base}.{what}", None, build))
    return found


def _attention_point(graph: Graph, name: str, *, attention: Attention, what: str) -> Node | None:
    return attention_point(graph, attention, what, name)


def add_canonical_names(graph: Graph, *, computed: bool = False) -> Graph:
    """``graph`` with its canonical names (and TransformerLens' spelling) as aliases.

    With ``computed`` (a frontend that lowers computed points) a canonical value the
    model does not hold is a computed point (:mod:`clouseau.ir.computed`), and so are
    the derived views ``blocks.*.logit_lens`` and ``blocks.*.attn.head_out``; without
    it such names are left out.
    A name the graph already uses (a module called ``blocks``) keeps its meaning: the
    canonical alias is left out.
    """
    roles = infer_roles(graph)
    if not roles.stacks:
        return graph
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    taken = set(graph._points_by_name) | {n.name for n in graph.nodes}
    aliases: dict[str, list[tuple[int, str]]] = {}
    extra: dict[str, list[Node]] = {}  # computed nodes, by the node they follow
    for named in canonical_names(roles, frozenset(m.path for m in graph.modules)):
        spellings = (
            (named.name,) if named.name.endswith(_OURS) else (named.name, tl_alias(named.name))
        )
        names = [n for n in spellings if n not in taken]
        if not names:
            continue
        if named.ref is not None:
            taken.update(names)
            aliases.setdefault(named.ref.node, []).extend((named.ref.index, n) for n in names)
            continue
        if not computed or named.build is None:
            continue
        node = named.build(graph, names[0])
        if node is None:
            continue
        taken.update(names)
        node = replace(node, aliases=tuple((0, n) for n in names[1:]))
        after = max(node.inputs, key=lambda r: order[r.node]).node
        extra.setdefault(after, []).append(node)
        taken.add(node.name)
    nodes: list[Node] = []
    for node in graph.nodes:
        more = aliases.get(node.name)
        nodes.append(replace(node, aliases=node.aliases + tuple(more)) if more else node)
        nodes += extra.get(node.name, ())
    return graph.with_nodes(tuple(nodes))
