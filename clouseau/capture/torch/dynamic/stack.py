"""Names of a Dynamo region's nodes from ``nn_module_stack`` (the static tiers' form).

An op is ``<innermost module path>.<op>`` with the traced path's counter
(:class:`~clouseau.capture.torch.naming.points.PointNamer`, a fresh one per region: no op
takes a module path); the op that returns a built-in torch.nn module's value is named by
the module path, and every other module whose single escaping value a node is gets its
path as an alias.
"""

from __future__ import annotations

import torch.fx as fx

from clouseau.capture.torch.naming.points import PointNamer, function_op, target_name
from clouseau.capture.torch.tracing.export import inside_leaf, module_stack
from clouseau.capture.torch.tracing.sources import source_from_stack_trace
from clouseau.capture.torch.tracing.traced import NodeInfo, is_leaf_type_name
from clouseau.ir.graph import NodeKind


def stack_infos(
    graph: fx.Graph,
    namer: PointNamer,
    root_type: str,
    weight_kind: dict[str, tuple[str, str]],
    input_names: dict[str, str] | None = None,
) -> dict[str, NodeInfo]:
    """The IR facts of each node, named from ``nn_module_stack``.

    ``weight_kind`` (by fx node name): the weights, as ``(kind, qualified name)``, read
    through ``get_attr`` or handed in as inputs (Dynamo lifts them); ``input_names``
    renames inputs.
    """
    stacks = {n: module_stack(n) for n in graph.nodes}
    members: dict[str, set[fx.Node]] = {}
    for node, stack in stacks.items():
        for key, _, _, _ in stack:
            members.setdefault(key, set()).add(node)
    owned = _module_outputs(members)
    infos: dict[str, NodeInfo] = {}
    for node in graph.nodes:
        stack = stacks[node]
        if node.op == "output":
            infos[node.name] = NodeInfo("output", NodeKind.OUTPUT, "output")
            continue
        if node.op == "placeholder" and node.name not in weight_kind:
            name = namer.state((input_names or {}).get(node.name, node.name))
            infos[node.name] = NodeInfo(name, NodeKind.INPUT, "input", target=str(node.target))
            continue
        if node.op in ("get_attr", "placeholder"):
            op, target = weight_kind.get(node.name, ("constant", str(node.target)))
            # A weight read only inside built-in modules (conv, linear) is not a point of
            # the fx graph either; keep those read by the user's own code.
            if all(inside_leaf(stacks[u]) for u in node.users):
                continue
            infos[node.name] = NodeInfo(namer.state(target), NodeKind.CONSTANT, op, target=target)
            continue
        path, module_type = (stack[-1][1], stack[-1][2]) if stack else ("", root_type)
        outputs_of = [entry for entry in reversed(stack) if node in owned.get(entry[0], ())]
        op = _op(node)
        if outputs_of and outputs_of[0][0] == stack[-1][0] and is_leaf_type_name(stack[-1][3]):
            name = namer.module_output(path)
            op = module_type.lower()
            outputs_of = outputs_of[1:]
        else:
            name = namer.op(path, op)[0]
        aliases = tuple(_alias(key, p) for key, p, _, _ in outputs_of)
        infos[node.name] = NodeInfo(
            name=name, kind=NodeKind.OP, op=op, module=path, module_type=module_type,
            target=target_name(node.target),
            source=source_from_stack_trace(node.meta.get("stack_trace")), aliases=aliases,
        )  # fmt: skip
    return infos


def _module_outputs(members: dict[str, set[fx.Node]]) -> dict[str, set[fx.Node]]:
    """For each module call, its escaping value when there is exactly one."""
    owned: dict[str, set[fx.Node]] = {}
    for key, nodes in members.items():
        escaping = [n for n in nodes if any(u not in nodes for u in n.users)]
        if len(escaping) == 1:
            owned[key] = {escaping[0]}
    return owned


def _alias(key: str, path: str) -> str:
    # torch.export keys the n-th call of a module "<path>@<n>"; name it "<path>_<n>" as fx does.
    _, _, count = key.rpartition("@")
    return f"{path}_{count}" if "@" in key and count.isdigit() and count != "0" else path


def _op(node: fx.Node) -> str:
    return function_op(node.target)
