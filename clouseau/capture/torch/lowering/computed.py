"""Lower computed points (:mod:`clouseau.ir.computed`) to fx nodes.

A computed point becomes fx ``call_function`` nodes right after its last input, emitted
only for points a save reads: the model's own nodes are untouched, so its outputs stay
bitwise. A run ``matmul -> scale -> mask`` (a pattern's scores) is one ``baddbmm`` onto
the mask's bias, one pass over the scores instead of three; a boolean mask's bias, and
whether it leaves a row empty, are computed once per mask, not once per attention that
reads it (every block of a decoder reads one). The fused kernel a pattern
is computed beside reads that bias too, where it can (:mod:`.kernel`). What a pattern
needs from a ``scaled_dot_product_attention`` call (its scale, causality, mask and
dropout) the IR builder records (``tracing/ir_build.py``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch.lowering.kernel import kernel_mask, read_mask, reads_mask
from clouseau.ir.computed import Op, program_of
from clouseau.ir.graph import Graph, Node, NodeKind, TensorSpec

#: fx meta key of the nodes a computed point's lowering adds.
COMPUTED_META = "clouseau_computed"


def _mask_fill(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    return x.masked_fill(~mask, value)


def _mask_fill_(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    return x.masked_fill_(~mask, value)


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` with each axis it is expanded over (stride 0) of size 1: the same values."""
    return t[tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride())]


def _causal_fill(x: torch.Tensor, value: float, offset: int) -> torch.Tensor:
    rows, cols = x.shape[-2], x.shape[-1]
    keep = torch.ones(rows, cols, dtype=torch.bool, device=x.device).tril(offset)
    return x.masked_fill(~keep, value)


def _causal_fill_(x: torch.Tensor, value: float, offset: int) -> torch.Tensor:
    rows, cols = x.shape[-2], x.shape[-1]
    if value == float("-inf"):  # exact, as in _mask_bias
        return x.add_(_causal_bias(rows, cols, offset, x.dtype, x.device))
    keep = torch.ones(rows, cols, dtype=torch.bool, device=x.device).tril(offset)
    return x.masked_fill_(~keep, value)


def _keep(x: torch.Tensor, axis: int, index: int) -> torch.Tensor:
    kept = torch.zeros_like(x)
    if index >= 0:
        kept.select(axis, index).copy_(x.select(axis, index))
    return kept


def _repeat(x: torch.Tensor, times: int, axis: int) -> torch.Tensor:
    """Each slice ``times`` times along ``axis`` (``repeat_interleave``), by a broadcast."""
    axis %= x.dim()
    shape = (*x.shape[: axis + 1], times, *x.shape[axis + 1 :])
    return x.unsqueeze(axis + 1).expand(shape).flatten(axis, axis + 1)


def _stack(*xs: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.stack(xs, dim=axis)


def _softmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    # A row of only -inf (a query that may attend to nothing: padding) is 0, not NaN: what
    # the fused kernel computes for it, and no NaN reaches the model through a decomposition.
    return _zero_nan_rows(torch.softmax(x, dim=axis, dtype=torch.float32)).to(x.dtype)


def _zero_nan_rows(out: torch.Tensor) -> torch.Tensor:
    """A softmax's NaN rows zeroed: in place, unless its backward (a gradient of the
    point) reads it."""
    return out.nan_to_num(0.0) if out.requires_grad else out.nan_to_num_(0.0)


def _softmax_full(x: torch.Tensor, axis: int) -> torch.Tensor:
    """The softmax of scores no row of which is only -inf (no mask empties one)."""
    return torch.softmax(x, dim=axis, dtype=torch.float32).to(x.dtype)


def _softmax_rows(x: torch.Tensor, axis: int, full: bool) -> torch.Tensor:
    """The softmax of scores whose only ``-inf`` rows are those a boolean mask empties,
    ``full`` when it empties none (:func:`_rows_full`): then no pass zeroes NaN rows."""
    out = torch.softmax(x, dim=axis, dtype=torch.float32)
    return (out if full else _zero_nan_rows(out)).to(x.dtype)


def _rows_full(mask: torch.Tensor, axis: int) -> bool:
    """Whether boolean ``mask`` keeps a key in every row along ``axis``. Read on a CPU
    only, where it costs no device sync (elsewhere False: the softmax zeroes NaN rows)."""
    return mask.device.type == "cpu" and bool(_compact(mask).any(axis).all())


def _scores(q: torch.Tensor, kt: torch.Tensor, scale: float, bias: torch.Tensor) -> torch.Tensor:
    """``q @ kt * scale + bias`` (``bias`` broadcasting to the result, of its dtype) in one
    pass over the result: the bias written once, the scaled product accumulated onto it."""
    *batch, rows, depth = q.shape
    out = torch.empty((*batch, rows, kt.shape[-1]), dtype=q.dtype, device=q.device)
    out.copy_(bias)
    flat = out.view(-1, rows, kt.shape[-1])
    flat.baddbmm_(q.reshape(-1, rows, depth), kt.reshape(-1, depth, kt.shape[-1]), alpha=scale)
    return out


def _scores_causal(q: torch.Tensor, kt: torch.Tensor, scale: float, offset: int) -> torch.Tensor:
    bias = _causal_bias(q.shape[-2], kt.shape[-1], offset, q.dtype, q.device)
    return _scores(q, kt, scale, bias)


def _mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive bias of a boolean mask: 0 where it is true, -inf elsewhere (exact: x + 0
    is x, x - inf is -inf), of the size the mask broadcasts from (heads, a batch it is
    expanded over: built once, not per head), in ``dtype`` (any float dtype is exact: a
    copy or an add of 0 and -inf converts them exactly)."""
    mask = _compact(mask)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)


def _causal_bias(
    rows: int, cols: int, offset: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The additive bias of causality: 0 on and below diagonal ``offset``, -inf above."""
    return torch.full((rows, cols), -math.inf, dtype=dtype, device=device).triu_(offset + 1)


#: The fx targets a computed point's matmul becomes (alone, or with its scale and mask).
MATMULS = frozenset({torch.matmul, _scores, _scores_causal})


def softmax_node(graph: fx.Graph, x: fx.Node, axis: int = -1) -> fx.Node:
    """A computed point's softmax of ``x`` over ``axis`` (at ``graph``'s insertion point)."""
    node = _emit(graph, Op.SOFTMAX, [x], {"axis": axis})
    node.meta[COMPUTED_META] = True
    return node


def _layer_norm(x: torch.Tensor, *params: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], *params, eps=eps)


def _rms_norm(x: torch.Tensor, *params: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, x.shape[-1:], *params, eps=eps)


#: Ops whose result is a tensor of their own (no view of an input): a later op may
#: write it in place.
_FRESH = frozenset({Op.MATMUL, Op.ADD, Op.MUL, Op.TANH, Op.SOFTMAX, Op.LAYER_NORM, Op.RMS_NORM,
                    Op.SUM, Op.KEEP, Op.STACK, Op.MASK_FILL, Op.CAUSAL_FILL})  # fmt: skip


_VIEWS = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.INDEX})


def _shared(graph: fx.Graph, source: fx.Node, fn: Callable[..., Any], *args: Any) -> fx.Node:
    """The node ``fn(source, *args)``, one per ``source``: right after it, so that every
    computed point reading ``source`` (each block's attention reads one mask) reads it."""
    for user in source.users:
        if user.target is fn and user.args[1:] == args:
            return user
    anchor = source
    if source.op == "placeholder":
        anchor = [n for n in graph.nodes if n.op == "placeholder"][-1]
    with graph.inserting_after(anchor):
        node = graph.call_function(fn, (source, *args))
    node.meta[COMPUTED_META] = True
    return node


def _bias_node(graph: fx.Graph, mask: fx.Node, scores: TensorSpec | None) -> fx.Node:
    """The shared additive bias (:func:`_mask_bias`) of boolean ``mask`` for scores of
    spec ``scores`` (float32 where it is not known)."""
    dtype = getattr(torch, scores.dtype.value) if scores is not None else torch.float32
    return _shared(graph, mask, _mask_bias, dtype if dtype.is_floating_point else torch.float32)


def _emit_inplace(
    graph: fx.Graph, op: Op, args: list[Any], attrs: Mapping[str, Any], out: TensorSpec | None
) -> fx.Node | None:
    """``op`` writing its first input (a private value no other op reads), where it can."""
    other = args[1] if len(args) > 1 else attrs.get("scalar")
    if op is Op.MASK_FILL and float(attrs["value"]) == -math.inf:
        # The mask's shared bias added: cheaper than a masked fill of every head.
        return graph.call_method("add_", (args[0], _bias_node(graph, args[1], out)))
    calls: dict[Op, Callable[[], fx.Node]] = {
        Op.MUL: lambda: graph.call_method("mul_", (args[0], other)),
        Op.ADD: lambda: graph.call_method("add_", (args[0], other)),
        Op.MASK_FILL: lambda: graph.call_function(_mask_fill_, (args[0], args[1], float(attrs["value"]))),
        Op.CAUSAL_FILL: lambda: graph.call_function(_causal_fill_, (args[0], float(attrs["value"]), attrs["offset"])),
    }  # fmt: skip
    call = calls.get(op)
    return call() if call is not None else None


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
        Op.REPEAT: lambda: graph.call_function(_repeat, (args[0], attrs["times"], attrs["axis"])),
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
    program = program_of(node)
    private = _private(program)
    fused = _fused_scores(program, private)
    skipped = {name for chain in fused.values() for name in chain[1:]}
    for step in program.nodes:
        if step.name in skipped:
            continue
        if step.name in fused:
            kernel = keys.get(str(node.attr("kernel")))
            env[step.name] = _emit_scores(
                graph, program, fused[step.name], env, by_key.get(kernel or "")
            )
            for name in fused[step.name][1:]:
                env[name] = env[step.name]
            continue
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
            op = Op(step.op)
            inplace = None
            if op is Op.SOFTMAX:
                inplace = _emit_softmax(graph, program, step, args[0], env)
            elif step.inputs[0].node in private and _in_place_keeps(program, step):
                inplace = _emit_inplace(graph, op, args, attrs, _spec(program, step.name))
            env[step.name] = inplace or _emit(graph, op, args, attrs)
            env[step.name].meta[COMPUTED_META] = True
    assert result is not None
    return result


def _fused_scores(program: Graph, private: set[str]) -> dict[str, tuple[str, str, str]]:
    """The runs ``matmul -> scale -> mask`` (a ``-inf`` fill or an added float mask) that one
    :func:`_scores` call computes, by their matmul: (matmul, scale, mask) step names."""
    order = {s.name: i for i, s in enumerate(program.nodes)}
    readers: dict[str, list[Node]] = {}
    for s in program.nodes:
        for r in s.inputs:
            readers.setdefault(r.node, []).append(s)
    runs: dict[str, tuple[str, str, str]] = {}
    for m in program.nodes:
        if m.op != Op.MATMUL.value or m.name not in private or not _batch_equal(program, m):
            continue
        (scale,) = readers[m.name]
        if scale.op != Op.MUL.value or len(scale.inputs) != 1 or scale.name not in private:
            continue
        (fill,) = readers[scale.name]
        if fill.inputs[0].node != scale.name or not _fusable_mask(program, fill, order[m.name]):
            continue
        runs[m.name] = (m.name, scale.name, fill.name)
    return runs


def _spec(program: Graph, name: str) -> TensorSpec | None:
    spec = program.node(name).outputs[0]
    return spec if isinstance(spec, TensorSpec) else None


def _batch_equal(program: Graph, matmul: Node) -> bool:
    """Whether ``matmul``'s operands have one dtype and the same batch axes (no broadcast),
    so that both are stacks of matrices of one count."""
    x, y = (_spec(program, r.node) for r in matmul.inputs)
    return (
        x is not None and y is not None and x.dtype == y.dtype
        and len(x.shape) >= 3 and x.shape[:-2] == y.shape[:-2]
    )  # fmt: skip


def _fusable_mask(program: Graph, fill: Node, before: int) -> bool:
    """Whether ``fill`` is a mask :func:`_scores` adds as a bias: a ``-inf`` fill, or a float
    mask of the scores' dtype (a value the program has before the matmul at ``before``)
    that broadcasts to them."""
    if fill.op in (Op.CAUSAL_FILL.value, Op.MASK_FILL.value):
        return float(str(fill.attr("value"))) == -math.inf
    if fill.op != Op.ADD.value or len(fill.inputs) != 2:
        return False
    scores, bias = _spec(program, fill.inputs[0].node), _spec(program, fill.inputs[1].node)
    names = [s.name for s in program.nodes]
    return (
        scores is not None and bias is not None and bias.dtype == scores.dtype
        and names.index(fill.inputs[1].node) < before
        and fill.outputs[0] == scores
    )  # fmt: skip


def _emit_scores(
    graph: fx.Graph,
    program: Graph,
    run: tuple[str, str, str],
    env: Mapping[str, fx.Node],
    kernel: fx.Node | None,
) -> fx.Node:
    """One :func:`_scores` call for ``run``; a boolean mask's bias is also what ``kernel``
    (the fused attention the pattern is computed beside) reads, where its dtype is the
    query's."""
    matmul, scale, fill = (program.node(name) for name in run)
    q, kt = (env[r.node] for r in matmul.inputs)
    factor = float(scale.attr("scalar"))  # type: ignore[arg-type]
    if fill.op == Op.CAUSAL_FILL.value:
        node = graph.call_function(_scores_causal, (q, kt, factor, fill.attr("offset")))
    elif fill.op == Op.MASK_FILL.value:
        mask, spec = env[fill.inputs[1].node], _spec(program, fill.name)
        bias = _bias_node(graph, mask, spec)
        query = _spec(program, matmul.inputs[0].node)
        same = spec is not None and query is not None and spec.dtype == query.dtype
        if same and reads_mask(kernel, mask):  # the kernel reads the bias too, where it can
            read_mask(kernel, _shared(graph, bias, kernel_mask, mask))
        node = graph.call_function(_scores, (q, kt, factor, bias))
    else:
        node = graph.call_function(_scores, (q, kt, factor, env[fill.inputs[1].node]))
    node.meta[COMPUTED_META] = True
    return node


def _emit_softmax(
    graph: fx.Graph, program: Graph, softmax: Node, x: fx.Node, env: Mapping[str, fx.Node]
) -> fx.Node | None:
    """A softmax that zeroes no NaN row where none can be (None: the general one)."""
    axis = softmax.attr("axis")
    if not _may_empty_rows(program, softmax):
        return graph.call_function(_softmax_full, (x, axis))
    fill = program.node(softmax.inputs[0].node)
    if fill.op == Op.MASK_FILL.value and not _may_empty_rows(program, fill) and axis == -1:
        # Rows only the mask can empty: the mask's rows say whether it empties one.
        full = _shared(graph, env[fill.inputs[1].node], _rows_full, axis)
        return graph.call_function(_softmax_rows, (x, axis, full))
    return None


def _may_empty_rows(program: Graph, softmax: Node) -> bool:
    """Whether a row of ``softmax``'s input may be only -inf (a NaN row to zero): unless it
    is a product of the program's, scaled, reshaped, at most causally filled with the
    diagonal kept (a kept key in every row)."""
    step = program.node(softmax.inputs[0].node)
    if step.op == Op.CAUSAL_FILL.value and int(step.attr("offset") or 0) >= 0:  # type: ignore[arg-type]
        step = program.node(step.inputs[0].node)
    while step.op == Op.RESHAPE.value or (step.op == Op.MUL.value and len(step.inputs) == 1):
        step = program.node(step.inputs[0].node)
    return step.op != Op.MATMUL.value


def _private(program: Graph) -> set[str]:
    """The steps whose value is a tensor of their own that exactly one later step reads."""
    reads: dict[str, int] = {}
    for step in program.nodes:
        for r in step.inputs:
            reads[r.node] = reads.get(r.node, 0) + 1
    fresh: set[str] = set()
    for s in program.nodes:
        if s.kind is NodeKind.OP and (
            Op(s.op) in _FRESH
            # A view of a value of the program's own that nothing else reads.
            or (Op(s.op) in _VIEWS and s.inputs[0].node in fresh and reads[s.inputs[0].node] == 1)
        ):
            fresh.add(s.name)
    outputs = {r.node for s in program.nodes if s.kind is NodeKind.OUTPUT for r in s.inputs}
    return {name for name in fresh if reads.get(name) == 1 and name not in outputs}


def _in_place_keeps(program: Graph, step: Node) -> bool:
    """Whether writing the first input in place gives what the op gives out of place:
    its shape (no broadcast to a larger one) and dtype (no promotion)."""
    specs = [program.node(r.node).outputs[r.index] for r in step.inputs]
    if step.op == Op.MASK_FILL.value:
        specs = specs[:1]  # the mask's own dtype is bool
    out = step.outputs[0]
    return all(
        isinstance(s, TensorSpec) and isinstance(out, TensorSpec) and s.dtype == out.dtype
        for s in specs
    ) and getattr(specs[0], "shape", None) == getattr(out, "shape", None)


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
