"""The fallback tracer: ``torch.export`` (non-strict), named from ``nn_module_stack``.

torch.export handles what torch.fx cannot (shape-dependent Python control flow, ``len``
or asserts on shapes), at the price of ATen-level ops. Names follow the fx convention as
far as the graph allows: an op is ``<innermost module path>.<op>`` with a local counter
(in-place ``add_`` is named ``add``), the op that returns a built-in torch.nn module's
value is named by the module path, and every other module whose single escaping value a
node is gets its path as an alias. Weights used only inside built-in modules are left out
of the IR, as in the fx graph.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.export.graph_signature import InputKind, OutputKind

from clouseau.capture.torch._compat import (
    check_export_inputs,
    tree_flatten,
    tree_flatten_with_path,
    tree_map,
    tree_unflatten,
)
from clouseau.capture.torch.naming import (
    LocalNamer,
    function_op,
    qualify,
    source_from_stack_trace,
    target_name,
)
from clouseau.capture.torch.traced import NodeInfo, Traced, canonical_kwargs, is_leaf_type_name
from clouseau.ir.errors import TraceError
from clouseau.ir.graph import Frontend, NodeKind

_WEIGHTS = {
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
}


def trace_export(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Traced:
    """Trace ``model`` with ``torch.export.export(strict=False)`` into a :class:`Traced`."""
    kwargs = canonical_kwargs(model, kwargs)
    ep = _export(model, args, kwargs)
    graph = ep.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    attrs: dict[str, Any] = {}
    weight_kind: dict[str, tuple[str, str]] = {}
    for node, spec in zip(placeholders, ep.graph_signature.input_specs, strict=True):
        if spec.kind is InputKind.USER_INPUT:
            continue
        if spec.kind not in _WEIGHTS:
            raise TraceError(
                f"torch.export produced an input clouseau cannot run: {spec.kind.name}"
            )
        target = str(spec.target)
        if spec.kind is InputKind.PARAMETER:
            attrs[target] = model.get_parameter(target)
        elif spec.kind is InputKind.BUFFER:
            attrs[target] = model.get_buffer(target)
        else:
            attrs[target] = ep.constants[target]
        # Read the live weight through get_attr, so the lowered module shares parameters
        # with the model (autograd, .to(), optimisers) instead of holding export's copies.
        with graph.inserting_before(node):
            getter = graph.create_node("get_attr", target)
        getter.meta = dict(node.meta)
        node.replace_all_uses_with(getter)
        graph.erase_node(node)
        weight_kind[getter.name] = (_WEIGHTS[spec.kind], target)
    for out_spec in ep.graph_signature.output_specs:
        if out_spec.kind is not OutputKind.USER_OUTPUT:
            raise TraceError(
                f"torch.export produced an output clouseau cannot run: {out_spec.kind.name}"
            )
    gm = fx.GraphModule(attrs, graph, class_name=type(model).__name__)
    call_sig = ep.module_call_graph[0].signature
    assert call_sig is not None
    in_spec, out_spec = call_sig.in_spec, call_sig.out_spec

    def to_inputs(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[Any, ...]:
        leaves, spec = tree_flatten((tuple(a), canonical_kwargs(model, kw)))
        if spec != in_spec:
            raise TraceError(
                f"the call's argument structure {spec} differs from the traced {in_spec}"
            )
        return tuple(leaves)

    user_inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ranges = ep.range_constraints

    def accepts(a: tuple[Any, ...], kw: dict[str, Any]) -> bool:
        flat, spec = tree_flatten_with_path((tuple(a), canonical_kwargs(model, kw)))
        if spec != in_spec:
            return False
        try:
            check_export_inputs(user_inputs, flat, ranges)
        except Exception:
            return False
        return True

    return Traced(
        gm=gm,
        frontend=Frontend.TORCH_EXPORT,
        infos=_infos(gm.graph, type(model).__name__, weight_kind),
        to_inputs=to_inputs,
        from_outputs=lambda flat: tree_unflatten(list(flat), out_spec),
        accepts=accepts,
    )


def _export(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Export with every tensor dimension free (``Dim.AUTO``): torch.export keeps dynamic
    what the model lets vary and specializes the rest, so one export serves every shape
    its guards allow. Inputs whose structure ``dynamic_shapes`` cannot describe (a custom
    container) are exported with static shapes, once per shape."""
    dynamic = tree_map(_auto_dims, (tuple(args), kwargs))
    try:
        return torch.export.export(
            model, args, kwargs, dynamic_shapes=(*dynamic[0], *dynamic[1].values()), strict=False
        )
    except Exception:
        return torch.export.export(model, args, kwargs, strict=False)


def _auto_dims(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {i: torch.export.Dim.AUTO for i in range(value.dim())}
    return None


def _infos(
    graph: fx.Graph,
    root_type: str,
    weight_kind: dict[str, tuple[str, str]],
    input_names: dict[str, str] | None = None,
) -> dict[str, NodeInfo]:
    """The IR facts of each node, named from ``nn_module_stack``.

    ``weight_kind`` (by fx node name): the weights, as ``(kind, qualified name)``, read
    through ``get_attr`` or handed in as inputs (Dynamo lifts them); ``input_names``
    renames inputs.
    """
    stacks = {n: _stack(n) for n in graph.nodes}
    members: dict[str, set[fx.Node]] = {}
    for node, stack in stacks.items():
        for key, _, _, _ in stack:
            members.setdefault(key, set()).add(node)
    owned = _module_outputs(members)
    namer = LocalNamer()
    infos: dict[str, NodeInfo] = {}
    for node in graph.nodes:
        stack = stacks[node]
        if node.op == "output":
            infos[node.name] = NodeInfo("output", NodeKind.OUTPUT, "output")
            continue
        if node.op == "placeholder" and node.name not in weight_kind:
            name = (input_names or {}).get(node.name, node.name)
            namer.reserve(name)
            infos[node.name] = NodeInfo(name, NodeKind.INPUT, "input", target=str(node.target))
            continue
        if node.op in ("get_attr", "placeholder"):
            op, target = weight_kind.get(node.name, ("constant", str(node.target)))
            # A weight read only inside built-in modules (conv, linear) is not a point of
            # the fx graph either; keep those read by the user's own code.
            if all(_inside_leaf(stacks[u]) for u in node.users):
                continue
            namer.reserve(target)
            infos[node.name] = NodeInfo(target, NodeKind.CONSTANT, op, target=target)
            continue
        path, module_type = (stack[-1][1], stack[-1][2]) if stack else ("", root_type)
        outputs_of = [entry for entry in reversed(stack) if node in owned.get(entry[0], ())]
        op = _op(node)
        if outputs_of and outputs_of[0][0] == stack[-1][0] and is_leaf_type_name(stack[-1][3]):
            name = namer.name(path)
            op = module_type.lower()
            outputs_of = outputs_of[1:]
        else:
            name = namer.name(qualify(path, op))
        aliases = tuple(_alias(key, p) for key, p, _, _ in outputs_of)
        infos[node.name] = NodeInfo(
            name=name, kind=NodeKind.OP, op=op, module=path, module_type=module_type,
            target=target_name(node.target),
            source=source_from_stack_trace(node.meta.get("stack_trace")), aliases=aliases,
        )  # fmt: skip
    return infos


def _stack(node: fx.Node) -> list[tuple[str, str, str, str]]:
    """(key, path, class name, qualified class) of each module call around ``node``, root excluded."""
    stack = node.meta.get("nn_module_stack") or {}
    found = []
    for key, (path, cls) in stack.items():
        if path:
            qualified = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
            found.append((key, path, qualified.rsplit(".", 1)[-1], qualified))
    return found


def _inside_leaf(stack: list[tuple[str, str, str, str]]) -> bool:
    return any(is_leaf_type_name(entry[3]) for entry in stack)


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
