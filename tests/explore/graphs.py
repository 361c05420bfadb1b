"""Hand-built IR graphs for the explorer: large ones, and one whose names hold markup."""

from __future__ import annotations

from clouseau.ir import DType, Graph, ModuleInfo, Node, NodeKind, Ref, TensorSpec

SPEC = TensorSpec((2, 8), DType.FLOAT32)
EVIL = 'blk<script>alert("x")</script>'


def big_graph(blocks: int, subs: int = 10, ops: int = 10) -> Graph:
    """``blocks x subs x ops`` operations in modules ``blocks.<b>.sub<s>``, a chain with skips."""
    nodes = [Node("x", NodeKind.INPUT, "input", outputs=(SPEC,))]
    modules = [ModuleInfo("", "Big"), ModuleInfo("blocks", "ModuleList")]
    prev = "x"
    for b in range(blocks):
        block_in = prev
        modules.append(ModuleInfo(f"blocks.{b}", "Block"))
        for s in range(subs):
            path = f"blocks.{b}.sub{s}"
            modules.append(ModuleInfo(path, "Sub"))
            for k in range(ops):
                name = f"{path}.add" if k == 0 else f"{path}.add_{k}"
                inputs = (Ref(prev), Ref(block_in)) if k == 0 and s == 0 else (Ref(prev),)
                nodes.append(Node(name, NodeKind.OP, "add", inputs, (SPEC,), path, "Sub"))
                prev = name
    nodes.append(Node("output", NodeKind.OUTPUT, "output", (Ref(prev),)))
    return Graph(tuple(nodes), name="big", modules=tuple(modules))


def evil_graph() -> Graph:
    """Module paths, a node name, an op and a graph name holding HTML and script."""
    nodes = (
        Node("x", NodeKind.INPUT, "input", outputs=(SPEC,)),
        Node(
            f"{EVIL}.relu",
            NodeKind.OP,
            "<img src=x onerror=alert(1)>",
            (Ref("x"),),
            (SPEC,),
            EVIL,
            "<b>Evil</b>",
            aliases=((0, EVIL),),
        ),
        Node("output", NodeKind.OUTPUT, "output", (Ref(f"{EVIL}.relu"),)),
    )
    return Graph(nodes, name="</script><script>alert('title')</script>",
                 modules=(ModuleInfo("", "Root"), ModuleInfo(EVIL, "<b>Evil</b>")))  # fmt: skip
