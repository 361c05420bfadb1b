"""Turn a marked jaxpr (see :mod:`~clouseau.capture.jax.jaxpr_trace`) into an IR Graph.

Sub-jaxprs are flattened into the one graph, so every point is selectable with one name:
``jit`` (module markers, the user's jitted functions), ``remat``/``checkpoint``, the
user's ``custom_jvp``/``custom_vjp`` functions, ``scan`` and ``while`` bodies and ``cond``
branches become nodes of the graph with a name prefix (see
:mod:`~clouseau.capture.jax.naming`); a scan, while or cond is also a node of its own,
after its bodies, whose outputs are the loop's or branch's results. Activation markers and
JAX's own jitted or custom-derivative helpers are one node each.

``Node.key`` is the equation's path through the nested jaxprs (``"3/0/5"``: equation 5 of
the sub-jaxpr of equation 0 of the sub-jaxpr of equation 3), built with the constructors
of :mod:`~clouseau.capture.jax.keys`; :mod:`~clouseau.capture.jax.plan` finds the values
to save by these keys.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from clouseau.capture.jax import _compat
from clouseau.capture.jax.computed_kernels import KERNEL_MARK
from clouseau.capture.jax.flop_ops import category
from clouseau.capture.jax.jaxpr_trace import FN_MARK, MODULE_MARK, Traced
from clouseau.capture.jax.keys import (
    CALLS,
    CUSTOM,
    REMAT,
    ROOT,
    body_key,
    branch_key,
    const_key,
    equation_key,
    input_key,
)
from clouseau.capture.jax.naming import Namer, clean, join
from clouseau.ir.canonical_names import add_canonical_names
from clouseau.ir.flops import category_attr
from clouseau.ir.graph import (
    VARIES,
    DType,
    Graph,
    ModuleInfo,
    Node,
    NodeKind,
    OpaqueSpec,
    Ref,
    Source,
    Spec,
    TensorSpec,
    TraceKind,
)
from clouseau.ir.verify import verify

# jax.nn activations that JAX inlines to one primitive, named as the function.
_ACTIVATION_PRIMITIVES = {"logistic": "sigmoid"}

# Loop carries, slices and results change between iterations, state the call assigns
# between calls: what is computed from them is a point whatever else it reads.
_VARIES = ((VARIES, True),)


@dataclass(frozen=True)
class Scope:
    """Where an equation is: its module and the name prefix of its ops."""

    module: str = ""
    module_type: str = ""
    prefix: str = ""  # "layers.1.foo" for ops named "layers.1.foo.<op>"


def build_graph(traced: Traced) -> Graph:
    """The verified IR graph of a traced model."""
    builder = _Builder(traced)
    closed = traced.jaxpr
    in_refs: list[Ref | None] = []
    for index, (var, name, is_param) in enumerate(
        zip(closed.jaxpr.invars, traced.in_names, traced.in_is_param, strict=True)
    ):
        kind, op = (NodeKind.CONSTANT, "param") if is_param else (NodeKind.INPUT, "input")
        attrs = _VARIES if index in traced.state else ()
        in_refs.append(
            builder.add(
                name, kind, op, (), (var,), Scope(), input_key(ROOT, index), attrs=attrs, exact=True
            )
        )
    const_refs = [
        builder.add("const", NodeKind.CONSTANT, "const", (), (v,), Scope(), const_key(ROOT, i))
        for i, v in enumerate(closed.jaxpr.constvars)
    ]
    outs = builder.walk(closed.jaxpr, const_refs, in_refs, ROOT, Scope())
    builder.nodes.append(
        Node(
            name="output",
            kind=NodeKind.OUTPUT,
            op="output",
            inputs=tuple(r for r in outs if r is not None),
        )
    )
    modules = (
        ModuleInfo("", traced.root_type, _total_params(traced)),
        *tuple(ModuleInfo(m.path, m.type_name, m.params) for m in traced.modules),
    )
    graph = Graph(
        nodes=tuple(builder.nodes),
        name=traced.name,
        trace_kind=TraceKind.JAX,
        modules=modules,
        meta=(("jax_version", __import__("jax").__version__),),
    )
    # Canonical names (blocks.0.resid_post, ...) as aliases, and computed points
    # (blocks.*.logit_lens, a fused attention's pattern) that capture.jax.computed lowers.
    return verify(add_canonical_names(graph, computed=True))


def _total_params(traced: Traced) -> int:
    avals = [v.aval for v in traced.jaxpr.jaxpr.invars]
    return sum(int(np.prod(a.shape)) for a, p in zip(avals, traced.in_is_param, strict=True) if p)


class _Builder:
    def __init__(self, traced: Traced) -> None:
        self.traced = traced
        self.nodes: list[Node] = []
        self.index: dict[str, int] = {}
        self.namer = Namer()
        self.namer.take("output")

    def add(
        self,
        base: str,
        kind: NodeKind,
        op: str,
        inputs: tuple[Ref, ...],
        outvars: tuple[Any, ...],
        scope: Scope,
        key: str,
        *,
        source: Source | None = None,
        attrs: tuple[tuple[str, Any], ...] = (),
        exact: bool = False,
    ) -> Ref:
        name = self.namer.take(base if exact else join(scope.prefix, base))
        node = Node(
            name=name,
            kind=kind,
            op=op,
            inputs=inputs,
            outputs=tuple(_spec(v.aval) for v in outvars),
            module=scope.module,
            module_type=scope.module_type,
            source=source,
            attrs=(*attrs, *category_attr(category(op))),
            key=key,
        )
        self.index[name] = len(self.nodes)
        self.nodes.append(node)
        return Ref(name, 0)

    def alias(self, ref: Ref, name: str, *, reserved: bool = False) -> None:
        position = self.index[ref.node]
        node = self.nodes[position]
        if not isinstance(node.outputs[ref.index], TensorSpec):
            return
        final = name if reserved else self.namer.take(name)
        self.nodes[position] = replace(node, aliases=(*node.aliases, (ref.index, final)))

    def walk(
        self,
        jaxpr: Any,
        const_refs: list[Ref | None],
        in_refs: list[Ref | None],
        key: str,
        scope: Scope,
    ) -> list[Ref | None]:
        env: dict[Any, Ref | None] = {}
        for var, ref in zip(jaxpr.constvars, const_refs, strict=True):
            env[var] = ref
        for var, ref in zip(jaxpr.invars, in_refs, strict=True):
            env[var] = ref
        for position, eqn in enumerate(jaxpr.eqns):
            ekey = equation_key(key, position)
            inputs = [env.get(v) if not _is_literal(v) else None for v in eqn.invars]
            outs = self.equation(eqn, ekey, inputs, scope)
            for var, ref in zip(eqn.outvars, outs, strict=True):
                env[var] = ref
        return [None if _is_literal(v) else env.get(v) for v in jaxpr.outvars]

    def equation(
        self, eqn: Any, key: str, inputs: list[Ref | None], scope: Scope
    ) -> list[Ref | None]:
        prim = eqn.primitive.name
        local = _local_scope(scope, eqn)
        refs = tuple(r for r in inputs if r is not None)
        if prim in CALLS:
            name = str(eqn.params.get("name", "jit"))
            inner = eqn.params["jaxpr"]
            if name.startswith(MODULE_MARK):
                index, mark = name[len(MODULE_MARK) :].split("_")
                entry = self.traced.modules[int(index)]
                sub = Scope(entry.path, entry.type_name, entry.path)
                outs = self._sub(inner.jaxpr, inputs, key, sub)
                # The module's outputs; after them, the state it assigns (not its output).
                self._alias_outputs(outs[: len(outs) - self.traced.marks[int(mark)]], entry.path)
                return outs
            if name.startswith(FN_MARK):
                return self._opaque(name[len(FN_MARK) :], eqn, key, refs, local)
            if name.startswith(KERNEL_MARK):
                return self._kernel(int(name[len(KERNEL_MARK) :]), eqn, key, inputs, local)
            if _is_jax_function(inner):
                return self._opaque(clean(name), eqn, key, refs, local)
            path = self.namer_peek(join(local.prefix, clean(name)))
            sub = replace(local, prefix=path)
            outs = self._sub(inner.jaxpr, inputs, key, sub)
            self._alias_outputs(outs, path, reserved=True)
            return outs
        if prim in REMAT:
            return self._sub(eqn.params["jaxpr"], inputs, key, local)
        if prim == "scan":
            return self._scan(eqn, key, inputs, local)
        if prim == "cond":
            return self._cond(eqn, key, inputs, local)
        if prim == "while":
            return self._while(eqn, key, inputs, local)
        if prim in CUSTOM:
            return self._custom(eqn, key, inputs, local)
        return self._opaque(_ACTIVATION_PRIMITIVES.get(prim, prim), eqn, key, refs, local)

    def _custom(
        self, eqn: Any, key: str, inputs: list[Ref | None], scope: Scope
    ) -> list[Ref | None]:
        # The user's custom_jvp/custom_vjp function opens like their jitted function;
        # JAX's own (jax.nn.relu, logsumexp) stay one op.
        fn = _custom_name(eqn) or eqn.primitive.name
        closed = eqn.params["call_jaxpr"]
        if _is_jax_function(closed):
            return self._opaque(fn, eqn, key, tuple(r for r in inputs if r is not None), scope)
        path = self.namer_peek(join(scope.prefix, fn))
        outs = self._sub(closed.jaxpr, inputs, key, replace(scope, prefix=path))
        self._alias_outputs(outs, path, reserved=True)
        return outs

    def namer_peek(self, base: str) -> str:
        # A scope's name is taken now so that a later op of the same name gets a suffix.
        return self.namer.take(base)

    def _sub(
        self, jaxpr: Any, inputs: list[Ref | None], key: str, scope: Scope
    ) -> list[Ref | None]:
        const_refs: list[Ref | None] = []
        for i, var in enumerate(jaxpr.constvars):
            const_refs.append(
                self.add("const", NodeKind.CONSTANT, "const", (), (var,), scope, const_key(key, i))
            )
        return self.walk(jaxpr, const_refs, inputs, key, scope)

    def _opaque(
        self, op: str, eqn: Any, key: str, refs: tuple[Ref, ...], scope: Scope
    ) -> list[Ref | None]:
        ref = self.add(
            op,
            NodeKind.OP,
            op,
            refs,
            tuple(eqn.outvars),
            scope,
            key,
            source=_source(eqn),
            attrs=_attrs(eqn),
        )
        return [Ref(ref.node, i) for i in range(len(eqn.outvars))]

    def _kernel(
        self, index: int, eqn: Any, key: str, inputs: list[Ref | None], scope: Scope
    ) -> list[Ref | None]:
        """A fused kernel call: its ops (selectable, as before), then a node of its own.

        Like a scan's, the kernel's node comes after its body's and holds its results,
        with the options a computed pattern reads (computed_kernels); its body's nodes
        count its FLOPs.
        """
        op, attrs = self.traced.kernels[index]
        name = self.namer_peek(join(scope.prefix, op))
        self._sub(eqn.params["jaxpr"].jaxpr, inputs, key, replace(scope, prefix=name))
        return self._control(name, op, eqn, key, inputs, scope, attrs)

    def _alias_outputs(self, outs: list[Ref | None], path: str, *, reserved: bool = False) -> None:
        tensors = [r for r in outs if r is not None]
        for i, ref in enumerate(tensors):
            if len(tensors) == 1:
                self.alias(ref, path, reserved=reserved)
            else:
                self.alias(ref, f"{path}:{i}")

    def _scan(self, eqn: Any, key: str, inputs: list[Ref | None], scope: Scope) -> list[Ref | None]:
        params = eqn.params
        body = params["jaxpr"]
        n_consts, n_carry = params["num_consts"], params["num_carry"]
        name = self.namer_peek(join(scope.prefix, "scan"))
        sub = replace(scope, prefix=name)
        inner_refs: list[Ref | None] = list(inputs[:n_consts])
        for i, var in enumerate(body.jaxpr.invars[n_consts:], start=n_consts):
            is_carry = i < n_consts + n_carry
            base, op = ("carry", "scan_carry") if is_carry else ("x", "scan_slice")
            inner_refs.append(self._body_input(base, op, inputs[i], var, sub, input_key(key, i)))
        self._sub(body.jaxpr, inner_refs, key, sub)
        attrs = (("length", int(params["length"])), ("reverse", bool(params["reverse"])))
        return self._control(name, "scan", eqn, key, inputs, scope, (*attrs, *_VARIES))

    def _cond(self, eqn: Any, key: str, inputs: list[Ref | None], scope: Scope) -> list[Ref | None]:
        branches = eqn.params["branches"]
        name = self.namer_peek(join(scope.prefix, "cond"))
        for b, (closed, label) in enumerate(zip(branches, _branch_labels(branches), strict=True)):
            sub = replace(scope, prefix=join(name, label))
            self._sub(closed.jaxpr, inputs[1:], branch_key(key, b), sub)
        return self._control(name, "cond", eqn, key, inputs, scope, (("branches", len(branches)),))

    def _while(
        self, eqn: Any, key: str, inputs: list[Ref | None], scope: Scope
    ) -> list[Ref | None]:
        params = eqn.params
        closed, body = params["body_jaxpr"], body_key(key)
        n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
        name = self.namer_peek(join(scope.prefix, "while"))
        sub = replace(scope, prefix=name)
        inner_refs: list[Ref | None] = list(inputs[n_cond : n_cond + n_body])
        for i, var in enumerate(closed.jaxpr.invars[n_body:], start=n_body):
            outer = inputs[n_cond + i]
            inner_refs.append(
                self._body_input("carry", "while_carry", outer, var, sub, input_key(body, i))
            )
        self._sub(closed.jaxpr, inner_refs, body, sub)
        return self._control(name, "while", eqn, key, inputs, scope, _VARIES)

    def _body_input(
        self, base: str, op: str, outer: Ref | None, var: Any, scope: Scope, key: str
    ) -> Ref:
        """A value entering a loop body each iteration (a carry or a slice)."""
        inputs = (outer,) if outer else ()
        return self.add(base, NodeKind.OP, op, inputs, (var,), scope, key, attrs=_VARIES)

    def _control(
        self,
        name: str,
        op: str,
        eqn: Any,
        key: str,
        inputs: list[Ref | None],
        scope: Scope,
        attrs: tuple[tuple[str, Any], ...],
    ) -> list[Ref | None]:
        """The node of a scan, cond or while, after the nodes of its bodies."""
        node = Node(
            name=name,
            kind=NodeKind.OP,
            op=op,
            inputs=tuple(r for r in inputs if r is not None),
            outputs=tuple(_spec(v.aval) for v in eqn.outvars),
            module=scope.module,
            module_type=scope.module_type,
            source=_source(eqn),
            attrs=(*attrs, *category_attr(category(op))),
            key=key,
        )
        self.index[name] = len(self.nodes)
        self.nodes.append(node)
        return [Ref(name, i) for i in range(len(eqn.outvars))]


def _branch_labels(branches: Any) -> list[str]:
    """``cond.<label>.<op>``: the branch function's name, else ``branch<i>`` (switch order)."""
    names = [
        clean(str(getattr(getattr(c.jaxpr, "debug_info", None), "func_name", "") or ""))
        for c in branches
    ]
    usable = all(n.isidentifier() and n != "lambda" for n in names) and len(set(names)) == len(
        names
    )
    return names if usable else [f"branch{i}" for i in range(len(branches))]


def _local_scope(scope: Scope, eqn: Any) -> Scope:
    # Equinox's layers name their own scopes ("eqx.nn.Linear"); the module path says it already.
    names = tuple(n for n in _compat.scope_names(eqn.source_info) if not n.startswith("eqx."))
    if not names:
        return scope
    return replace(scope, prefix=join(scope.prefix, *(clean(n) for n in names)))


def _is_literal(var: Any) -> bool:
    return type(var).__name__ == "Literal"


def _is_jax_function(closed: Any) -> bool:
    info = getattr(closed.jaxpr, "debug_info", None)
    src = getattr(info, "func_src_info", "") or ""
    path = src.rsplit(" at ", 1)[-1].rsplit(":", 1)[0]
    return bool(path) and _compat.is_library_file(path)


def _custom_name(eqn: Any) -> str:
    for param in ("call_jaxpr", "fun_jaxpr"):
        closed = eqn.params.get(param)
        info = getattr(getattr(closed, "jaxpr", None), "debug_info", None)
        name = getattr(info, "func_name", "")
        if name:
            return clean(name)
    return ""


def _source(eqn: Any) -> Source | None:
    frame = _compat.user_frame(eqn.source_info)
    if frame is None:
        return None
    return Source(file=frame[0], line=frame[1], function=frame[2])


def _attrs(eqn: Any) -> tuple[tuple[str, Any], ...]:
    # Only small, plain parameters: enough to read the printed graph.
    if eqn.primitive.name in CALLS | CUSTOM:
        return ()
    out = _flop_attrs(eqn)
    for k, v in eqn.params.items():
        if (isinstance(v, bool | int | float | str) and not k.startswith("_")) or (
            isinstance(v, tuple) and all(isinstance(x, int) for x in v)
        ):
            out.append((k, v))
    return tuple(out)


def _flop_attrs(eqn: Any) -> list[tuple[str, Any]]:
    """What FLOP counts need beyond shapes (clouseau.ir.flops): contraction, layout."""
    numbers = eqn.params.get("dimension_numbers")
    if eqn.primitive.name == "dot_general" and numbers is not None:
        return [("lhs_contracting_dims", tuple(int(d) for d in numbers[0][0]))]
    if eqn.primitive.name == "conv_general_dilated" and hasattr(numbers, "rhs_spec"):
        return [("rhs_out_dim", int(numbers.rhs_spec[0]))]
    return []


def _spec(aval: Any) -> Spec:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return OpaqueSpec(type(aval).__name__)
    try:
        return TensorSpec(tuple(int(d) for d in shape), DType(np.dtype(dtype).name))
    except (TypeError, ValueError):
        return OpaqueSpec(str(dtype))
