"""Lower computed points (:mod:`clouseau.ir.computed`) to fx nodes, and a fused kernel's options.

A computed point becomes fx ``call_function`` nodes right after its last input, emitted
only for points a save reads: the model's own nodes are untouched, so its outputs stay
bitwise. :func:`kernel_attrs` records what a computed attention pattern needs from an
``scaled_dot_product_attention`` call (its scale, causality, mask and dropout).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx as fx

from clouseau.ir.computed import Op, program_of
from clouseau.ir.graph import AttrValue, Node, NodeKind

_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
#: fx meta key of the nodes a computed point's lowering adds.
COMPUTED_META = "clouseau_computed"


def kernel_attrs(fx_node: fx.Node, op: str) -> tuple[tuple[str, AttrValue], ...]:
    """The options of a ``scaled_dot_product_attention`` call, as IR attrs (else none)."""
    if op != "scaled_dot_product_attention" or fx_node.op != "call_function":
        return ()
    bound = dict(zip(_SDPA_ARGS, fx_node.args, strict=False)) | dict(fx_node.kwargs)
    nodes = [a for a in fx_node.args[:3] if isinstance(a, fx.Node)]
    mask = bound.get("attn_mask")
    scale = bound.get("scale")
    if len(nodes) != 3 or not (scale is None or isinstance(scale, int | float)):
        return ()
    return (
        ("scale", None if scale is None else float(scale)),
        ("is_causal", bool(bound.get("is_causal", False))),
        ("mask", 3 if isinstance(mask, fx.Node) else -1),
        ("dropout_p", float(bound.get("dropout_p", 0.0) or 0.0)),
        ("enable_gqa", bool(bound.get("enable_gqa", False))),
    )


def _mask_fill(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    return x.masked_fill(~mask, value)


def _causal_fill(x: torch.Tensor, value: float, offset: int) -> torch.Tensor:
    rows, cols = x.shape[-2], x.shape[-1]
    keep = torch.ones(rows, cols, dtype=torch.bool, device=x.device).tril(offset)
    return x.masked_fill(~keep, value)


def _keep(x: torch.Tensor, axis: int, index: int) -> torch.Tensor:
    kept = torch.zeros_like(x)
    if index >= 0:
        kept.select(axis, index).copy_(x.select(axis, index))
    return kept


def _stack(*xs: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.stack(xs, dim=axis)


def _softmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.softmax(x, dim=axis, dtype=torch.float32).to(x.dtype)


def _layer_norm(x: torch.Tensor, *params: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], *params, eps=eps)


def _rms_norm(x: torch.Tensor, *params: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, x.shape[-1:], *params, eps=eps)


def _emit(graph: fx.Graph, op: Op, args: list[Any], attrs: Mapping[str, Any]) -> fx.Node:
    calls: dict[Op, Callable[[], fx.Node]] = {
        Op.MATMUL: lambda: graph.call_function(torch.matmul, tuple(args)),
        Op.ADD: lambda: graph.call_function(operator.add, (args[0], args[1] if len(args) > 1 else attrs["scalar"])),
        Op.MUL: lambda: graph.call_function(operator.mul, (args[0], args[1] if len(args) > 1 else attrs["scalar"])),
        Op.TANH: lambda: graph.call_function(torch.tanh, (args[0],)),
        Op.SOFTMAX: lambda: graph.call_function(_softmax, (args[0], attrs["axis"])),
        Op.LAYER_NORM: lambda: graph.call_function(_layer_norm, tuple(args), {"eps": attrs["eps"]}),
        Op.RMS_NORM: lambda: graph.call_function(_rms_norm, tuple(args), {"eps": attrs["eps"]}),
        Op.RESHAPE: lambda: graph.call_function(torch.reshape, (args[0], tuple(attrs["shape"]))),
        Op.TRANSPOSE: lambda: graph.call_function(torch.transpose, (args[0], attrs["a"], attrs["b"])),
        Op.INDEX: lambda: graph.call_function(torch.select, (args[0], attrs["axis"], attrs["index"])),
        Op.SUM: lambda: graph.call_function(torch.sum, (args[0], attrs["axis"])),
        Op.REPEAT: lambda: graph.call_function(torch.repeat_interleave, (args[0], attrs["times"]), {"dim": attrs["axis"]}),
        Op.KEEP: lambda: graph.call_function(_keep, (args[0], attrs["axis"], attrs["index"])),
        Op.STACK: lambda: graph.call_function(_stack, tuple(args), {"axis": attrs["axis"]}),
        Op.MASK_FILL: lambda: graph.call_function(_mask_fill, (args[0], args[1], float(attrs["value"]))),
        Op.CAUSAL_FILL: lambda: graph.call_function(_causal_fill, (args[0], float(attrs["value"]), attrs["offset"])),
    }  # fmt: skip
    return calls[op]()


def lower_computed(
    graph: fx.Graph,
    node: Node,
    inputs: list[fx.Node],
    by_key: Mapping[str, fx.Node],
    keys: Mapping[str, str],
) -> fx.Node:
    """Emit ``node``'s program into ``graph`` (at its insertion point) on fx values ``inputs``.

    ``by_key`` maps the model's fx node names to their copies in ``graph``; ``keys`` the
    IR names of the model's nodes to fx node names (what :attr:`Op.REPLAY` replays).
    """
    env: dict[str, fx.Node] = {}
    result: fx.Node | None = None
    for step in program_of(node).nodes:
        if step.kind is NodeKind.INPUT:
            env[step.name] = inputs[int(step.name.removeprefix("in"))]
            continue
        if step.kind is NodeKind.OUTPUT:
            result = env[step.inputs[0].node]
            continue
        args = [env[r.node] for r in step.inputs]
        attrs = dict(step.attrs)
        if step.op == Op.REPLAY.value:
            env[step.name] = _replay(graph, args[0], attrs, by_key, keys)
        else:
            env[step.name] = _emit(graph, Op(step.op), args, attrs)
            env[step.name].meta[COMPUTED_META] = True
    assert result is not None
    return result


def replayed(node: Node) -> tuple[str, ...]:
    """The model's nodes (IR names) a computed point's program replays."""
    return tuple(
        str(name)
        for step in program_of(node).nodes
        if step.op == Op.REPLAY.value
        for name in step.attr("nodes") or ()
    )


def run_computed(gm: fx.GraphModule, values: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """The values of ``gm``'s computed fx nodes ``names`` from the model's values ``values``
    (by fx node name: what the first, probed call computed), running nothing else."""
    env: dict[fx.Node, Any] = {}
    out: dict[str, Any] = {}
    for n in gm.graph.nodes:
        if n.meta.get(COMPUTED_META):
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
            if n.op == "call_module":
                env[n] = gm.get_submodule(str(n.target))(*args, **kwargs)
            elif n.op == "call_method":
                env[n] = getattr(args[0], str(n.target))(*args[1:], **kwargs)
            else:
                env[n] = n.target(*args, **kwargs)
            if n.name in names:
                out[n.name] = env[n]
        elif n.op == "get_attr":
            env[n] = operator.attrgetter(str(n.target))(gm)
        else:
            env[n] = values.get(n.name)
    return out


def _replay(
    graph: fx.Graph,
    start: fx.Node,
    attrs: Mapping[str, Any],
    by_key: Mapping[str, fx.Node],
    keys: Mapping[str, str],
) -> fx.Node:
    """Copies of the model's nodes ``attrs["nodes"]`` reading ``start`` for ``attrs["source"]``."""
    env = {by_key[keys[attrs["source"]]]: start}
    last = start
    for name in attrs["nodes"]:
        original = by_key[keys[name]]
        last = graph.node_copy(original, lambda n: env.get(n, n))
        last.meta[COMPUTED_META] = True
        env[original] = last
    return last
