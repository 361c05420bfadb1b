"""Per-node metadata computed from the IR: FLOPs, parameters, tables (pandas) and a summary (rich).

Every node already holds its output specs (shape, dtype), module path and type and source
line; this module adds what is derived from them: the parameter count of the node's
module (from ``Graph.modules``) and an estimate of its floating-point operations.

FLOPs count a multiply-add as 2 and ignore biases, as the textbook formulas do:

=====================  ================================================================
op                     FLOPs
=====================  ================================================================
linear                 2 * in_features * numel(out)  (= 2 * in * out * batch)
matmul, dot_general    2 * K * numel(out)  (K: the contracted size)
conv (1/2/3-d)         2 * Cin/groups * prod(kernel) * numel(out)
                       (= 2 * Cin/groups * kh * kw * Cout * Hout * Wout * N)
conv_transpose         2 * Cout/groups * prod(kernel) * numel(in)
multi-head attention   in/out projections 2*E*(nq + nk + nv + nq), scores and
                       weighted sum 4 * nq * S  (n: numel, S: key length)
scaled_dot_product     4 * numel(q) * S
softmax                5 per element; layer/group/instance/RMS norm 5; batch norm 4
elementwise            1 per element of the largest operand (add, mul, relu, exp, ...)
reductions, pooling    1 per input element (reduce_window: per output * window)
reshapes, indexing     0
anything else          unknown (None), left out of totals
=====================  ================================================================

Nodes inside a ``lax.scan`` body run once per iteration: :func:`total_flops` multiplies
them by the loop length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clouseau.ir.errors import MissingExtraError
from clouseau.ir.graph import INSTRUMENTATION, Graph, Node, NodeKind, Spec, TensorSpec

_FREE = frozenset({
    "input", "param", "parameter", "buffer", "constant", "const", "getitem", "getattr", "size",
    "reshape", "view", "flatten", "unflatten", "transpose", "permute", "contiguous", "expand",
    "expand_as", "squeeze", "unsqueeze", "cat", "concat", "concatenate", "stack", "split",
    "chunk", "broadcast_in_dim", "convert_element_type", "slice", "dynamic_slice",
    "dynamic_update_slice", "gather", "copy", "copy_p", "identity", "dropout", "to", "type",
    "float", "clone", "detach", "swapaxes", "rev", "pad", "iota", "squeeze_p", "expand_dims",
    "scan_carry", "scan_slice", "flip", "roll", "repeat", "tile", "narrow", "select", "t",
    "stop_gradient", "zeros_like", "ones_like", "full", "zeros", "ones", "arange",
})  # fmt: skip
_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "truediv", "div", "floordiv", "pow", "integer_pow", "neg", "abs",
    "relu", "relu6", "gelu", "silu", "swish", "sigmoid", "logistic", "tanh", "exp", "exp2",
    "expm1", "log", "log1p", "sqrt", "rsqrt", "erf", "erfc", "sin", "cos", "max", "min",
    "maximum", "minimum", "where", "select_n", "clamp", "clip", "hardtanh", "leakyrelu",
    "leaky_relu", "elu", "selu", "celu", "softplus", "softsign", "mish", "hardswish",
    "hardsigmoid", "sign", "square", "reciprocal", "rem", "mod", "eq", "ne", "lt", "le",
    "gt", "ge", "and_", "or_", "not", "logical_and", "logical_or", "masked_fill", "lerp",
    "addcmul", "addcdiv", "glu", "sub_", "atan2", "cbrt", "ceil", "floor", "round",
})  # fmt: skip
_REDUCTIONS = frozenset({
    "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "var", "std", "norm",
    "logsumexp", "cumsum", "cumprod", "reduce_sum", "reduce_max", "reduce_min",
    "reduce_prod", "reduce_and", "reduce_or", "argmax_p", "cumlogsumexp", "cummax", "all",
    "any", "count_nonzero",
})  # fmt: skip
_NORMS = {
    "layernorm": 5, "layer_norm": 5, "groupnorm": 5, "group_norm": 5, "rmsnorm": 5,
    "rms_norm": 5, "instancenorm1d": 5, "instancenorm2d": 5, "instancenorm3d": 5,
    "instance_norm": 5, "batchnorm1d": 4, "batchnorm2d": 4, "batchnorm3d": 4, "batch_norm": 4,
    "softmax": 5, "log_softmax": 5, "logsoftmax": 5, "softmin": 5,
}  # fmt: skip


def _tensors(specs: Iterable[Spec]) -> list[TensorSpec]:
    return [s for s in specs if isinstance(s, TensorSpec)]


def input_specs(graph: Graph, node: Node) -> tuple[Spec, ...]:
    """The specs of the values ``node`` reads, in order."""
    return tuple(graph.node(r.node).outputs[r.index] for r in node.inputs)


def node_flops(graph: Graph, node: Node) -> int | None:
    """An estimate of the FLOPs of one execution of ``node`` (see the module docs).

    Returns
    -------
    int or None
        None when the op has no rule; 0 for data movement and graph plumbing.
    """
    if node.kind in INSTRUMENTATION or node.kind in (NodeKind.INPUT, NodeKind.CONSTANT):
        return 0
    if node.kind is NodeKind.OUTPUT:
        return 0
    op = node.op.lower()
    ins = _tensors(input_specs(graph, node))
    outs = _tensors(node.outputs)
    rule = _rule(op)
    if rule is None:
        return None
    try:
        return rule(node, ins, outs)
    except (IndexError, ZeroDivisionError, TypeError, ValueError):
        return None  # a shape the rule does not expect (a scalar, an odd layout)


def _rule(op: str) -> Any:
    if op in _FREE or op == "scan":
        return lambda node, ins, outs: 0
    if op.startswith(("conv_transpose", "convtranspose")):
        return _conv_transpose
    if op.startswith("conv"):
        return _conv
    if op == "linear":
        return lambda node, ins, outs: 2 * ins[0].shape[-1] * outs[0].numel
    if op in ("matmul", "mm", "bmm", "einsum_mm"):
        return lambda node, ins, outs: 2 * ins[0].shape[-1] * outs[0].numel
    if op in ("addmm", "baddbmm", "addbmm"):
        return lambda node, ins, outs: 2 * ins[1].shape[-1] * outs[0].numel
    if op == "dot_general":
        return _dot_general
    if op in ("multiheadattention", "multi_head_attention_forward"):
        return _multihead_attention
    if op == "scaled_dot_product_attention":
        return lambda node, ins, outs: 4 * ins[0].numel * ins[1].shape[-2]
    if op in _NORMS:
        factor = _NORMS[op]
        return lambda node, ins, outs: factor * (outs or ins)[0].numel
    if "pool" in op:
        return lambda node, ins, outs: ins[0].numel
    if op.startswith("reduce_window"):
        return lambda node, ins, outs: outs[0].numel * math.prod(node.attr("window_dimensions"))
    if op in _ELEMENTWISE or op in _REDUCTIONS or op.rstrip("_") in _ELEMENTWISE:
        return lambda node, ins, outs: max(s.numel for s in (*ins, *outs)) if outs else 0
    return None


def _ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _conv(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    out = outs[0]
    in_channels, kernel = node.attr("in_channels"), node.attr("kernel_size")
    if in_channels is not None and kernel is not None:
        groups = int(node.attr("groups", 1))  # type: ignore[arg-type]
        per_output = int(in_channels) // groups * math.prod(_ints(kernel))  # type: ignore[arg-type]
    else:
        # The weight is an input (F.conv2d, lax.conv): Cout x Cin/groups x kernel.
        weight = ins[1]
        out_dim = int(node.attr("rhs_out_dim", 0))  # type: ignore[arg-type]
        per_output = weight.numel // weight.shape[out_dim]
    return 2 * per_output * out.numel


def _conv_transpose(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    out_channels, kernel = node.attr("out_channels"), node.attr("kernel_size")
    if out_channels is not None and kernel is not None:
        groups = int(node.attr("groups", 1))  # type: ignore[arg-type]
        per_input = int(out_channels) // groups * math.prod(_ints(kernel))  # type: ignore[arg-type]
    else:
        weight = ins[1]  # Cin x Cout/groups x kernel
        per_input = weight.numel // weight.shape[0]
    return 2 * per_input * ins[0].numel


def _dot_general(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    contract = node.attr("lhs_contracting_dims")
    if contract is not None:
        k = math.prod(ins[0].shape[d] for d in _ints(contract))
    else:
        # Without batch dims numel(lhs) * numel(rhs) = numel(out) * K^2.
        k = math.isqrt(ins[0].numel * ins[1].numel // outs[0].numel)
    return 2 * k * outs[0].numel


def _multihead_attention(node: Node, ins: list[TensorSpec], outs: list[TensorSpec]) -> int:
    q, k, v = ins[:3]
    embed = q.shape[-1]
    seq_axis = 1 if node.attr("batch_first", False) and len(k.shape) == 3 else 0
    keys = k.shape[seq_axis]
    projections = 2 * embed * (q.numel + k.numel + v.numel + q.numel)
    return projections + 4 * q.numel * keys


def loop_factor(graph: Graph) -> dict[str, int]:
    """How many times each node runs per call: the product of its enclosing scan lengths."""
    lengths = {n.key: int(n.attr("length", 1)) for n in graph.nodes if n.op == "scan" and n.key}  # type: ignore[arg-type]
    factors: dict[str, int] = {}
    for node in graph.nodes:
        parts = node.key.split("/") if lengths and node.key else []
        factor = 1
        for i in range(1, len(parts)):
            factor *= lengths.get("/".join(parts[:i]), 1)
        factors[node.name] = factor
    return factors


def total_flops(graph: Graph, nodes: Iterable[Node] | None = None) -> int:
    """The FLOPs of one call (nodes with no rule count 0), loop iterations included."""
    factors = loop_factor(graph)
    total = 0
    for node in graph.nodes if nodes is None else nodes:
        flops = node_flops(graph, node)
        total += (flops or 0) * factors.get(node.name, 1)
    return total


def module_params(graph: Graph, node: Node) -> int:
    """The parameters of the module ``node`` belongs to (0 at the root or outside modules)."""
    if not node.module:
        return 0
    info = graph.module(node.module)
    return info.params if info is not None else 0


@dataclass(frozen=True)
class NodeMetadata:
    """Everything clouseau knows about one node, as one record."""

    name: str
    kind: str
    op: str
    shapes: tuple[tuple[int, ...] | None, ...]
    dtypes: tuple[str | None, ...]
    module: str
    module_type: str
    module_params: int
    flops: int | None
    source: str | None


def node_metadata(graph: Graph, node: Node) -> NodeMetadata:
    """The :class:`NodeMetadata` of ``node`` in ``graph``."""
    return NodeMetadata(
        name=node.name,
        kind=node.kind.value,
        op=node.op,
        shapes=tuple(s.shape if isinstance(s, TensorSpec) else None for s in node.outputs),
        dtypes=tuple(s.dtype.value if isinstance(s, TensorSpec) else None for s in node.outputs),
        module=node.module,
        module_type=node.module_type,
        module_params=module_params(graph, node),
        flops=node_flops(graph, node),
        source=None if node.source is None else f"{node.source.file}:{node.source.line}",
    )


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise MissingExtraError("pandas", "pandas") from None
    return pandas


def _point_rows(graph: Graph) -> dict[str, dict[str, Any]]:
    """The metadata of every point name (node names and aliases)."""
    intervened = {n.inputs[0]: str(n.attr("action")) for n in graph.interventions}
    saved = {str(name) for s in graph.saves for name in s.attr("names")}  # type: ignore[union-attr]
    grads = {str(name) for s in graph.grad_saves for name in s.attr("names")}  # type: ignore[union-attr]
    factors = loop_factor(graph)
    rows: dict[str, dict[str, Any]] = {}
    for point in graph.points:
        node, spec = point.node, point.spec
        flops = node_flops(graph, node)
        rows[point.name] = {
            "name": point.name,
            "node": node.name,
            "op": node.op,
            "alias": point.is_alias,
            "shape": spec.shape,
            "dtype": spec.dtype.value,
            "nbytes": spec.nbytes,
            "module": node.module,
            "module_type": node.module_type,
            "module_params": module_params(graph, node),
            "flops": None if flops is None else flops * factors.get(node.name, 1),
            "source": None if node.source is None else f"{node.source.file}:{node.source.line}",
            "intervention": intervened.get(point.ref),
            "saved": point.name in saved,
            "grad_saved": point.name + ".grad" in grads,
        }
    return rows


def points_frame(graph: Graph) -> Any:
    """A pandas DataFrame with one row per point of ``graph``, in execution order.

    Columns: name, node, op, alias, shape, dtype, nbytes, module, module_type,
    module_params, flops (per call, loops included; None when unknown), source,
    intervention (the action, or None), saved, grad_saved.

    Raises
    ------
    clouseau.ir.errors.MissingExtraError
        pandas is not installed.
    """
    pd = _pandas()
    return _typed(pd.DataFrame(list(_point_rows(graph).values())))


def capture_frame(records: Sequence[Any], graphs: Sequence[Graph]) -> Any:
    """A pandas DataFrame with one row per saved array of a capture (``Capture.to_pandas``).

    Parameters
    ----------
    records
        The capture's records (``Capture.records``): key, names, node, call, order, graph,
        index.
    graphs
        The capture's graphs by id (``Capture.graphs``); a record's metadata comes from
        the point of its graph. Gradients (``<name>.grad``) take their point's metadata.

    Returns
    -------
    pandas.DataFrame
        Columns: name, names, call, index, order, graph, key, grad, then the point columns
        of :func:`points_frame` (shape is the traced shape: a value saved under ``vmap``
        has the batch axis in front of it).
    """
    pd = _pandas()
    tables = [_point_rows(g) for g in graphs]
    rows = []
    for record in records:
        name = record.names[0]
        grad = name.endswith(".grad")
        base = name[: -len(".grad")] if grad else name
        table = tables[record.graph] if record.graph < len(tables) else {}
        meta = {k: v for k, v in table.get(base, {}).items() if k != "name"}
        rows.append({
            "name": name, "names": tuple(record.names), "call": record.call,
            "index": tuple(record.index), "order": record.order, "graph": record.graph,
            "key": record.key, "grad": grad, **meta,
        })  # fmt: skip
    return _typed(pd.DataFrame(rows))


def _typed(frame: Any) -> Any:
    # Unknown FLOPs are missing values, not NaN floats: keep the column integral.
    if "flops" in frame:
        frame["flops"] = frame["flops"].astype("Int64")
    return frame


def summary(graph: Graph, *, file: Any = None) -> None:
    """Print the module tree of ``graph`` with output shapes, parameters and FLOPs.

    Parameters
    ----------
    graph
        The graph (instrumented or not: intervened points are marked).
    file
        Where to print (a text stream); standard output by default.
    """
    from rich.console import Console

    Console(file=file).print(summary_table(graph))


def summary_table(graph: Graph) -> Any:
    """The rich ``Table`` that :func:`summary` prints."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{graph.name or 'graph'} ({graph.frontend.value})", show_lines=False)
    for column, justify in (("name", "left"), ("type / op", "left"), ("output", "left"),
                            ("params", "right"), ("FLOPs", "right")):  # fmt: skip
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    specs = {p.name: p.spec for p in graph.points}
    intervened = {n.inputs[0].node: str(n.attr("action")) for n in graph.interventions}
    modules = {m.path: m for m in graph.modules}
    factors = loop_factor(graph)
    flops = {n.name: (node_flops(graph, n) or 0) * factors.get(n.name, 1) for n in graph.nodes}
    inside: dict[str, int] = {}
    for node in graph.nodes:
        for path in _ancestors(node.module):
            inside[path] = inside.get(path, 0) + flops[node.name]
    opened: set[str] = set()
    leaves: set[str] = set()  # modules whose call is one node (torch leaf modules)
    for node in graph.nodes:
        if node.kind in INSTRUMENTATION or node.kind in (NodeKind.CONSTANT, NodeKind.OUTPUT):
            continue
        chain = [p for p in _ancestors(node.module) if p in modules]
        if chain and (node.name == chain[-1] or chain[-1] in leaves):
            # A leaf module's call: one row with the module's type and parameters (a
            # second call of the same module, "relu_1", gets its own row likewise).
            leaf, chain = chain[-1], chain[:-1]
            leaves.add(leaf)
        else:
            leaf = ""
        for depth, path in enumerate(chain):
            if path not in opened:
                opened.add(path)
                table.add_row(
                    _indent(depth, path, chain[depth - 1] if depth else ""),
                    escape(modules[path].type),
                    _shape(specs.get(path)),
                    f"{modules[path].params:,}",
                    f"{inside.get(path, 0):,}",
                )
        opened.add(leaf)
        known = node_flops(graph, node) is not None
        table.add_row(
            _indent(len(chain), node.name, chain[-1] if chain else ""),
            escape(modules[leaf].type if leaf else node.op) + _mark(intervened.get(node.name)),
            ", ".join(_shape(s) for s in node.outputs),
            f"{modules[leaf].params:,}" if leaf else "",
            f"{flops[node.name]:,}" if known else "?",
        )
    root = modules.get("")
    total = root.params if root is not None else sum(m.params for m in graph.modules)
    table.add_section()
    table.add_row("total", "", "", f"{total:,}", f"{total_flops(graph):,}")
    return table


def _ancestors(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _indent(depth: int, name: str, parent: str) -> str:
    from rich.markup import escape

    short = name[len(parent) + 1 :] if parent and name.startswith(parent + ".") else name
    return escape("  " * depth + short)


def _mark(action: str | None) -> str:
    from rich.markup import escape

    return f" [red]<- {escape(action)}[/red]" if action else ""


def _shape(spec: Spec | None) -> str:
    from rich.markup import escape

    return "" if spec is None else escape(str(spec))
