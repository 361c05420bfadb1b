"""Lower computed points (:mod:`clouseau.ir.computed`) on JAX: their programs in ``jnp``.

A computed point has no equation of its own. The plan (:mod:`~clouseau.capture.jax.plan`)
saves what it reads, its inputs and what the model's nodes it replays read besides, as
internal slots that never leave the device; after the model has run, :func:`fill`
evaluates each selected point's program on them inside the same traced computation. So
a computed point works wherever the call runs (the user's ``jit``, ``vmap``, ``grad``,
``lax.scan``), never feeds the model (its outputs stay bitwise), and costs nothing
unless a save reads it. A point inside the model's ``lax.scan`` is evaluated once per
iteration (``vmap`` over the stacked iterations); :attr:`~clouseau.ir.computed.Op.REPLAY`
binds the model's own equations again, so the logit lens is what the model computes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from clouseau.capture.jax import _compat
from clouseau.capture.jax.keys import parse_key
from clouseau.ir.computed import Op, is_computed, program_of
from clouseau.ir.errors import TraceError
from clouseau.ir.graph import Graph, Node, NodeKind, Ref

if TYPE_CHECKING:  # the plan places what computed points read (reads, below)
    from clouseau.capture.jax.plan import Plan


def reads(graph: Graph, node: Node) -> tuple[Ref, ...]:
    """The model values ``node``'s program needs: its inputs, then what its replays read."""
    found = list(node.inputs)
    for step in program_of(node).nodes:
        if step.op != Op.REPLAY.value:
            continue
        chain = {str(n) for n in step.attr("nodes") or ()} | {str(step.attr("source"))}
        for name in step.attr("nodes") or ():
            for ref in graph.node(str(name)).inputs:
                if ref.node not in chain and ref not in found:
                    found.append(ref)
    return tuple(found)


#: Where a decomposed kernel's rewrite puts the scores and pattern the model reads: past
#: the kernel's own outputs, at these offsets (:mod:`~clouseau.capture.jax.decompose`).
READ_AT = {"scores": 0, "pattern": 1}


def kernel_points(graph: Graph, kernels: set[str]) -> dict[str, dict[str, Node]]:
    """The computed ``scores`` and ``pattern`` points of each fused kernel of ``kernels``."""
    found: dict[str, dict[str, Node]] = {k: {} for k in kernels}
    for node in graph.nodes:
        kernel, what = node.attr("kernel"), node.attr("attention")
        if is_computed(node) and kernel in found and what in READ_AT:
            found[str(kernel)][str(what)] = node
    return found


def intervened_kernels(graph: Graph) -> dict[str, dict[str, Node]]:
    """The fused kernels that an intervention on their computed scores or pattern
    replaces by their decomposition, with their computed points (:func:`kernel_points`)."""
    hit = set()
    for node in graph.interventions:
        target = graph.node(node.inputs[0].node)
        if is_computed(target) and isinstance(target.attr("kernel"), str):
            hit.add(str(target.attr("kernel")))
    return kernel_points(graph, hit)


def fill(closed: Any, graph: Graph, plan: Plan, saved: dict[int, Any]) -> None:
    """Put the values of ``plan``'s computed slots in ``saved``, from their read slots."""
    for point in plan.computed:
        node = graph.node(point.node)
        slots = [plan.slots[i] for i in point.reads]
        if any(s.stream for s in slots):
            raise TraceError(
                f"clouseau cannot compute {node.name!r} inside a while_loop body: select a "
                "value the model holds there, or write the loop as a lax.scan"
            )
        depth = max((s.loops for s in slots), default=0)
        if any(s.loops not in (0, depth) for s in slots):
            raise TraceError(f"clouseau cannot compute {node.name!r} across nested scans")
        refs = reads(graph, node)

        def one(
            *values: Any, node: Node = node, refs: tuple[Ref, ...] = refs, point: Any = point
        ) -> Any:
            value = evaluate(graph, node, dict(zip(refs, values, strict=True)), closed)
            # An intervention on a view changes its saved value, per iteration of a scan.
            return value if point.change is None else point.change(value)

        axes = [0 if s.loops else None for s in slots]
        fn: Callable[..., Any] = one
        for _ in range(depth):  # one value per iteration of the enclosing scans
            fn = jax.vmap(fn, in_axes=axes)
        saved[point.slot] = fn(*[saved[i] for i in point.reads])


def evaluate(graph: Graph, node: Node, values: Mapping[Ref, Any], closed: Any) -> Any:
    """The value of the computed point ``node`` from the model's values ``values``."""
    env: dict[str, Any] = {}
    for step in program_of(node).nodes:
        if step.kind is NodeKind.INPUT:
            env[step.name] = values[node.inputs[int(step.name.removeprefix("in"))]]
        elif step.kind is NodeKind.OUTPUT:
            return env[step.inputs[0].node]
        elif step.op == Op.REPLAY.value:
            env[step.name] = _replay(graph, step, env[step.inputs[0].node], values, closed)
        else:
            args = [env[r.node] for r in step.inputs]
            env[step.name] = _OPS[Op(step.op)](args, dict(step.attrs))
    raise TraceError(f"the program of {node.name!r} has no output")


def _replay(graph: Graph, step: Node, start: Any, values: Mapping[Ref, Any], closed: Any) -> Any:
    """The model's equations ``step.attr("nodes")`` rebound, ``start`` for their source."""
    local: dict[str, list[Any]] = {str(step.attr("source")): [start]}
    last = start
    for name in step.attr("nodes") or ():
        model_node = graph.node(str(name))
        eqn = equation_at(closed.jaxpr, model_node.key)
        refs = iter(model_node.inputs)
        invals = []
        for var in eqn.invars:
            if type(var).__name__ == "Literal":
                invals.append(var.val)
                continue
            ref = next(refs)
            invals.append(local[ref.node][ref.index] if ref.node in local else values[ref])
        local[model_node.name] = _compat.bind_equation(eqn, invals)
        last = local[model_node.name][0]
    return last


def equation_at(jaxpr: Any, key: str) -> Any:
    """The equation at ``key`` (see :mod:`~clouseau.capture.jax.keys`) in ``jaxpr``."""
    eqn, entered = None, False
    for step in parse_key(key):
        if not step.isdigit():  # a branch or a while body of the equation before
            jaxpr, entered = _body(eqn, step), True
            continue
        if eqn is not None and not entered:
            jaxpr = _body(eqn, step)
        eqn, entered = jaxpr.eqns[int(step)], False
    if eqn is None:
        raise TraceError(f"no equation at {key!r}")
    return eqn


def _body(eqn: Any, step: str) -> Any:
    """The sub-jaxpr of ``eqn`` that the key step after it enters."""
    params = eqn.params
    if step.startswith("b"):
        return params["branches"][int(step[1:])].jaxpr
    if step == "body":
        return params["body_jaxpr"].jaxpr
    inner = params.get("jaxpr", params.get("call_jaxpr"))
    return getattr(inner, "jaxpr", inner)


def _keep(x: Any, axis: int, index: int) -> Any:
    if index < 0:
        return jnp.zeros_like(x)
    where = jnp.arange(x.shape[axis]) == index
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return jnp.where(where.reshape(shape), x, jnp.zeros_like(x))


def _causal_fill(x: Any, value: float, offset: int) -> Any:
    keep = jnp.tril(jnp.ones(x.shape[-2:], bool), offset)
    return jnp.where(keep, x, jnp.asarray(value, x.dtype))


def softmax(x: Any, axis: int = -1) -> Any:
    """The softmax of computed points (:attr:`~clouseau.ir.computed.Op.SOFTMAX`)."""
    f = x.astype(jnp.float32)
    # A row of only -inf (a query that sees no key) is 0, as a fused kernel gives it.
    empty = jnp.all(f == -jnp.inf, axis=axis, keepdims=True)
    return jnp.where(empty, 0.0, jax.nn.softmax(f, axis=axis)).astype(x.dtype)


def _layer_norm(args: Sequence[Any], eps: float) -> Any:
    x = args[0]
    mean = jnp.mean(x, axis=-1, keepdims=True)
    out = (x - mean) * jax.lax.rsqrt(jnp.var(x, axis=-1, keepdims=True) + eps)
    return _affine(out, args[1:])


def _rms_norm(args: Sequence[Any], eps: float) -> Any:
    x = args[0]
    return _affine(x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps), args[1:])


def _affine(x: Any, params: Sequence[Any]) -> Any:
    if params:
        x = x * params[0]
    if len(params) > 1:
        x = x + params[1]
    return x


def _second(args: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    return args[1] if len(args) > 1 else attrs["scalar"]


_OPS: dict[Op, Callable[[list[Any], dict[str, Any]], Any]] = {
    Op.MATMUL: lambda a, _: jnp.matmul(a[0], a[1]),
    Op.ADD: lambda a, t: a[0] + _second(a, t),
    Op.MUL: lambda a, t: a[0] * _second(a, t),
    Op.TANH: lambda a, _: jnp.tanh(a[0]),
    Op.SOFTMAX: lambda a, t: softmax(a[0], t["axis"]),
    Op.LAYER_NORM: lambda a, t: _layer_norm(a, t["eps"]),
    Op.RMS_NORM: lambda a, t: _rms_norm(a, t["eps"]),
    Op.RESHAPE: lambda a, t: jnp.reshape(a[0], tuple(t["shape"])),
    Op.TRANSPOSE: lambda a, t: jnp.swapaxes(a[0], t["a"], t["b"]),
    Op.INDEX: lambda a, t: jnp.take(a[0], t["index"], axis=t["axis"]),
    Op.SUM: lambda a, t: jnp.sum(a[0], axis=t["axis"]),
    Op.REPEAT: lambda a, t: jnp.repeat(a[0], t["times"], axis=t["axis"]),
    Op.KEEP: lambda a, t: _keep(a[0], t["axis"], t["index"]),
    Op.STACK: lambda a, t: jnp.stack(a, axis=t["axis"]),
    Op.MASK_FILL: lambda a, t: jnp.where(a[1], a[0], jnp.asarray(float(t["value"]), a[0].dtype)),
    Op.CAUSAL_FILL: lambda a, t: _causal_fill(a[0], float(t["value"]), t["offset"]),
}
