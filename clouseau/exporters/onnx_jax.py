"""Lower a traced JAX / Equinox model (its jaxpr) to ONNX, saves as extra named outputs.

The jaxpr is walked as the JAX frontend's interpreter walks it, with the same equation keys
(:mod:`clouseau.ir.keys`; ``"2/0"``: equation 0 inside equation 2), so every IR point maps
to the ONNX value computed at its key. Calls (``jit``, ``custom_jvp_call``, ``remat``, ...) are
inlined; every other primitive is lowered by a rule in ``RULES``. A primitive without a
rule raises :class:`UnsupportedOpError` naming the IR node and the primitive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from clouseau.exporters._jax_rules import RULES, UnsupportedOpError, aval, onnx_type
from clouseau.ir.errors import ClouseauError
from clouseau.ir.graph import Graph, NodeKind
from clouseau.ir.keys import ROOT, const_key, enclosing, equation_key, input_key

OPSET = 18


# The call primitives inlined here (the frontend's CALLS, REMAT and CUSTOM, and the
# older call spellings); tests/jax/test_keys.py checks that the frontend's are all here.
CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
          "custom_vjp_call_jaxpr", "remat", "remat2", "checkpoint")  # fmt: skip


class Converter:
    """Builds one ONNX graph from a jaxpr; ``at`` maps (equation key, output) -> value name."""

    def __init__(self, graph: Graph, reserved: Sequence[str]) -> None:
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.taken: set[str] = set(reserved)
        self.at: dict[tuple[str, int], str] = {}
        self.by_key = {n.key: n.name for n in graph.nodes if n.key}
        self._consts: dict[tuple[bytes, str, tuple[int, ...]], str] = {}
        self.current = ""  # the key of the equation being lowered

    # -- building blocks ----------------------------------------------------------------
    def fresh(self, hint: str = "v") -> str:
        name, i = hint, 0
        while name in self.taken:
            i += 1
            name = f"{hint}_{i}"
        self.taken.add(name)
        return name

    def const(self, value: Any, dtype: Any = None, hint: str = "const") -> str:
        array = np.asarray(value, dtype=dtype)
        key = (array.tobytes(), str(array.dtype), array.shape)
        if key not in self._consts:
            name = self.fresh(hint)
            self.initializers.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [self.fresh(f"{op_type.lower()}") for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs

    def op1(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.op(op_type, inputs, **attrs)[0]

    def shape_const(self, shape: Sequence[int]) -> str:
        return self.const(np.array(list(shape), dtype=np.int64), hint="shape")

    def here(self) -> str:
        """The IR node of the equation being lowered, quoted, for error messages."""
        return repr(self.node_name(self.current))

    def node_name(self, key: str) -> str:
        """The IR node computed at ``key`` (or the innermost one enclosing it)."""
        for where in reversed([*enclosing(key), key]):
            found = self.by_key.get(where)
            if found:
                return found
        return f"<equation {key}>"

    # -- the walk (mirrors the JAX frontend's interpreter, clouseau.ir.keys' grammar) -----
    def run(self, jaxpr: Any, consts: Sequence[str], args: Sequence[str], key: str) -> list[str]:
        env: dict[Any, str] = {}

        def read(var: Any) -> str:
            if type(var).__name__ == "Literal":
                return self.const(np.asarray(var.val, dtype=var.aval.dtype), hint="lit")
            return env[var]

        def record(where: str, values: Sequence[str]) -> None:
            for i, v in enumerate(values):
                self.at[(where, i)] = v

        for i, (var, value) in enumerate(zip(jaxpr.constvars, consts, strict=True)):
            env[var] = value
            record(const_key(key, i), [value])
        for i, (var, value) in enumerate(zip(jaxpr.invars, args, strict=True)):
            env[var] = value
            record(input_key(key, i), [value])
        for position, eqn in enumerate(jaxpr.eqns):
            ekey = equation_key(key, position)
            invals = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, ekey, invals)
            for var, value in zip(eqn.outvars, outs, strict=True):
                env[var] = value
            record(ekey, outs)
        return [read(v) for v in jaxpr.outvars]

    def equation(self, eqn: Any, key: str, ins: list[str]) -> list[str]:
        prim = eqn.primitive.name
        self.current = key
        if prim in CALLS:
            inner = _inner_jaxpr(eqn.params)
            if inner is not None:
                jaxpr, consts = (
                    (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, ())
                )
                const_names = [self.const(np.asarray(c), hint="c") for c in consts]
                return self.run(jaxpr, const_names, ins, key)
        rule = RULES.get(prim)
        if rule is None:
            raise UnsupportedOpError(
                f"cannot export {self.node_name(key)!r} to ONNX: JAX primitive {prim!r} has no "
                f"ONNX lowering in clouseau (supported: {', '.join(sorted(RULES))}). Leave it out "
                "of the exported function, or open an issue with the model."
            )
        outs = rule(self, eqn, ins)
        return outs if isinstance(outs, list) else [outs]


def _inner_jaxpr(params: dict[str, Any]) -> Any:
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if name in params:
            return params[name]
    return None


def export_jax(lowered: Any, opset: int = OPSET) -> tuple[onnx.ModelProto, Graph, tuple[str, ...]]:
    """The ONNX model of ``model(*args, **kwargs)`` with the ``select``-ed points as outputs.

    Parameters are stored as initializers named by their pytree path; array arguments
    become graph inputs named after the function's parameters. Outputs are the model's
    array outputs (``output`` or ``output_0``, ``output_1``...), then one per selected
    point, named by the point.
    """
    traced, graph, plan = lowered.traced, lowered.graph, lowered.plan
    if plan.computed:
        raise UnsupportedOpError(
            f"cannot export {plan.computed[0].node!r} to ONNX: it is a computed point (a "
            "logit lens, a per-head output, a fused kernel's pattern), which clouseau does "
            "not lower to ONNX; select the values it is computed from instead"
        )
    # Inputs and parameters are not repeated as outputs (ONNX values have one name).
    leaf_kinds = (NodeKind.INPUT, NodeKind.CONSTANT)
    plan = replace(
        plan, slots=tuple(s for s in plan.slots if graph.node(s.node).kind not in leaf_kinds)
    )
    inside = [s.names[0] for s in plan.slots if s.names and s.nested]
    if inside:
        raise UnsupportedOpError(
            f"cannot export {inside[0]!r} to ONNX: it is computed inside a lax.scan, cond or "
            "while_loop, which clouseau does not lower to ONNX; select points outside it"
        )
    conv = Converter(graph, [s.names[0] for s in plan.slots])
    closed = traced.jaxpr
    arrays = lowered.arrays
    names: list[str] = []
    inputs: list[onnx.ValueInfoProto] = []
    for hint, is_param, array, var in zip(
        traced.in_names, traced.in_is_param, arrays, closed.jaxpr.invars, strict=True
    ):
        name = conv.fresh(hint)
        names.append(name)
        if is_param:
            conv.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        else:
            shape, dtype = aval(var)
            inputs.append(helper.make_tensor_value_info(name, onnx_type(dtype), shape))
    consts = [conv.const(np.asarray(c), hint="c") for c in closed.consts]
    results = conv.run(closed.jaxpr, consts, names, ROOT)
    outputs: list[onnx.ValueInfoProto] = []
    single = len(results) == 1
    for i, (value, var) in enumerate(zip(results, closed.jaxpr.outvars, strict=True)):
        name = conv.fresh("output" if single else f"output_{i}")
        conv.nodes.append(helper.make_node("Identity", [value], [name]))
        shape, dtype = aval(var)
        outputs.append(helper.make_tensor_value_info(name, onnx_type(dtype), shape))
    for slot in plan.slots:
        value = conv.at.get((slot.key, slot.output))
        if value is None:
            raise ClouseauError(
                f"clouseau could not find the value of {slot.names[0]!r} while lowering to ONNX"
            )
        conv.nodes.append(helper.make_node("Identity", [value], [slot.names[0]]))
        spec = graph.point(slot.names[0]).spec
        outputs.append(
            helper.make_tensor_value_info(slot.names[0], onnx_type(spec.dtype.value), spec.shape)
        )
    onnx_graph = helper.make_graph(
        conv.nodes, traced.name or "model", inputs, outputs, conv.initializers
    )
    proto = helper.make_model(
        onnx_graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="clouseau"
    )
    return proto, graph, tuple(s.names[0] for s in plan.slots)
