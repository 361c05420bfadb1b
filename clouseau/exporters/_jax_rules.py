"""Lowering rules of JAX primitives to ONNX nodes, used by :mod:`clouseau.exporters.onnx_jax`.

Each rule takes the converter, the jaxpr equation and the ONNX names of its inputs, and
returns the ONNX name(s) of its outputs. Shapes and dtypes come from the equation's avals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto, helper

from clouseau.ir.errors import ClouseauError

if TYPE_CHECKING:
    from clouseau.exporters.onnx_jax import Converter


class UnsupportedOpError(ClouseauError, NotImplementedError):
    """A primitive of the model has no ONNX lowering; the message names node and op."""


Rule = Callable[["Converter", Any, list[str]], "str | list[str]"]


def _simple(op_type: str) -> Rule:
    return lambda c, eqn, ins: c.op1(op_type, ins)


def aval(var: Any) -> tuple[tuple[int, ...], np.dtype]:
    return tuple(var.aval.shape), np.dtype(var.aval.dtype)


def onnx_type(dtype: Any) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _reshape(c: Converter, x: str, shape: Sequence[int]) -> str:
    return c.op1("Reshape", [x, c.shape_const(shape)])


def _integer_pow(c: Converter, eqn: Any, ins: list[str]) -> str:
    y = int(eqn.params["y"])
    if y == 0:
        shape, dtype = aval(eqn.outvars[0])
        return c.op1("Expand", [c.const(np.ones((), dtype)), c.shape_const(shape)])
    # Repeated multiplication, as XLA computes integer powers (Pow would round differently).
    acc, base, n = None, ins[0], abs(y)
    while n:
        if n & 1:
            acc = base if acc is None else c.op1("Mul", [acc, base])
        n >>= 1
        if n:
            base = c.op1("Mul", [base, base])
    assert acc is not None
    return acc if y > 0 else c.op1("Reciprocal", [acc])


def _convert(c: Converter, eqn: Any, ins: list[str]) -> str:
    return c.op1("Cast", ins, to=onnx_type(eqn.params["new_dtype"]))


def _broadcast_in_dim(c: Converter, eqn: Any, ins: list[str]) -> str:
    shape = tuple(eqn.params["shape"])
    dims = tuple(eqn.params["broadcast_dimensions"])
    in_shape, _ = aval(eqn.invars[0])
    expanded = [1] * len(shape)
    for d, size in zip(dims, in_shape, strict=True):
        expanded[d] = size
    x = _reshape(c, ins[0], expanded) if tuple(expanded) != in_shape else ins[0]
    return x if tuple(expanded) == shape else c.op1("Expand", [x, c.shape_const(shape)])


def _to_out_shape(c: Converter, eqn: Any, ins: list[str]) -> str:
    return _reshape(c, ins[0], aval(eqn.outvars[0])[0])


def _transpose(c: Converter, eqn: Any, ins: list[str]) -> str:
    return c.op1("Transpose", ins[:1], perm=list(eqn.params["permutation"]))


def _reduce(op_type: str) -> Rule:
    def rule(c: Converter, eqn: Any, ins: list[str]) -> str:
        axes = list(eqn.params["axes"])
        if not axes:
            return c.op1("Identity", ins)
        return c.op1(op_type, [ins[0], c.const(np.array(axes, np.int64), hint="axes")], keepdims=0)

    return rule


def _argminmax(op_type: str) -> Rule:
    def rule(c: Converter, eqn: Any, ins: list[str]) -> str:
        (axis,) = eqn.params["axes"]
        out = c.op1(op_type, ins, axis=int(axis), keepdims=0)
        return c.op1("Cast", [out], to=onnx_type(eqn.params["index_dtype"]))

    return rule


def _dot_general(c: Converter, eqn: Any, ins: list[str]) -> str:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lshape, _ = aval(eqn.invars[0])
    rshape, _ = aval(eqn.invars[1])
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lsub = [""] * len(lshape)
    rsub = [""] * len(rshape)
    for l_dim, r_dim in zip(lb, rb, strict=True):
        lsub[l_dim] = rsub[r_dim] = next(letters)
    for l_dim, r_dim in zip(lc, rc, strict=True):
        lsub[l_dim] = rsub[r_dim] = next(letters)
    for sub in (lsub, rsub):
        for i, s in enumerate(sub):
            if not s:
                sub[i] = next(letters)
    out = [lsub[d] for d in lb]
    out += [s for d, s in enumerate(lsub) if d not in lb and d not in lc]
    out += [s for d, s in enumerate(rsub) if d not in rb and d not in rc]
    equation = f"{''.join(lsub)},{''.join(rsub)}->{''.join(out)}"
    result = c.op1("Einsum", ins, equation=equation)
    out_dtype = aval(eqn.outvars[0])[1]
    if out_dtype != aval(eqn.invars[0])[1]:
        result = c.op1("Cast", [result], to=onnx_type(out_dtype))
    return result


def _conv(c: Converter, eqn: Any, ins: list[str]) -> str:
    p = eqn.params
    dn = p["dimension_numbers"]
    if any(d != 1 for d in p["lhs_dilation"]) or p["batch_group_count"] != 1:
        raise UnsupportedOpError(
            f"cannot export {c.here()}: conv_general_dilated with input dilation "
            "(a transposed convolution) or batch groups has no ONNX lowering in clouseau"
        )
    lhs = _permute(c, ins[0], tuple(dn.lhs_spec))
    rhs = _permute(c, ins[1], tuple(dn.rhs_spec))
    pads = [lo for lo, _ in p["padding"]] + [hi for _, hi in p["padding"]]
    if any(x < 0 for x in pads):
        raise UnsupportedOpError(
            f"cannot export {c.here()}: conv_general_dilated with negative padding"
        )
    out = c.op1("Conv", [lhs, rhs], strides=list(p["window_strides"]), pads=pads,
                dilations=list(p["rhs_dilation"]), group=int(p["feature_group_count"]))  # fmt: skip
    # The convolution returns (N, C, spatial...); out_spec says where each of those lives.
    spec = tuple(dn.out_spec)
    perm = [spec.index(j) for j in range(len(spec))]
    return out if perm == sorted(perm) else c.op1("Transpose", [out], perm=perm)


def _permute(c: Converter, x: str, perm: tuple[int, ...]) -> str:
    return x if list(perm) == sorted(perm) else c.op1("Transpose", [x], perm=list(perm))


def _reduce_window(op_type: str) -> Rule:
    def rule(c: Converter, eqn: Any, ins: list[str]) -> str:
        p = eqn.params
        window, strides = tuple(p["window_dimensions"]), tuple(p["window_strides"])
        padding = tuple(tuple(x) for x in p["padding"])
        if any(d != 1 for d in (*p["base_dilation"],)):
            raise UnsupportedOpError(f"cannot export {c.here()}: reduce_window with base dilation")
        shape, _ = aval(eqn.invars[0])
        # Pooling runs over trailing axes; every leading axis with a window of 1 is folded
        # into ONNX's batch axis, with a channel axis of 1.
        lead = 0
        while (
            lead < len(shape)
            and window[lead] == 1
            and strides[lead] == 1
            and padding[lead] == (0, 0)
        ):
            lead += 1
        pooled = shape[lead:]
        x = _reshape(c, ins[0], (int(np.prod(shape[:lead], dtype=np.int64)), 1, *pooled))
        pads = [lo for lo, _ in padding[lead:]] + [hi for _, hi in padding[lead:]]
        attrs: dict[str, Any] = dict(
            kernel_shape=list(window[lead:]), strides=list(strides[lead:]), pads=pads
        )
        if op_type == "MaxPool":
            out = c.op1("MaxPool", [x], dilations=list(p["window_dilation"][lead:]), **attrs)
        else:
            out = c.op1("AveragePool", [x], count_include_pad=1, **attrs)
            out = c.op1(
                "Mul", [out, c.const(np.asarray(np.prod(window[lead:]), aval(eqn.outvars[0])[1]))]
            )
        return _reshape(c, out, aval(eqn.outvars[0])[0])

    return rule


def _select_n(c: Converter, eqn: Any, ins: list[str]) -> str:
    if len(ins) != 3:
        raise UnsupportedOpError(f"cannot export {c.here()}: select_n with {len(ins) - 1} cases")
    pred = ins[0]
    if aval(eqn.invars[0])[1] != np.bool_:
        pred = c.op1("Cast", [pred], to=TensorProto.BOOL)
    return c.op1("Where", [pred, ins[2], ins[1]])


def _clamp(c: Converter, eqn: Any, ins: list[str]) -> str:
    lo, x, hi = ins
    return c.op1("Max", [c.op1("Min", [x, hi]), lo])


def _concatenate(c: Converter, eqn: Any, ins: list[str]) -> str:
    return c.op1("Concat", ins, axis=int(eqn.params["dimension"]))


def _slice(c: Converter, eqn: Any, ins: list[str]) -> str:
    p = eqn.params
    starts, limits = list(p["start_indices"]), list(p["limit_indices"])
    steps = list(p["strides"]) if p["strides"] else [1] * len(starts)
    i64 = np.int64
    return c.op1("Slice", [ins[0], c.const(np.array(starts, i64)), c.const(np.array(limits, i64)),
                           c.const(np.arange(len(starts), dtype=i64)), c.const(np.array(steps, i64))])  # fmt: skip


def _pad(c: Converter, eqn: Any, ins: list[str]) -> str:
    config = eqn.params["padding_config"]
    if any(interior or lo < 0 or hi < 0 for lo, hi, interior in config):
        raise UnsupportedOpError(f"cannot export {c.here()}: pad with interior or negative padding")
    pads = [lo for lo, _, _ in config] + [hi for _, hi, _ in config]
    return c.op1("Pad", [ins[0], c.const(np.array(pads, np.int64)), ins[1]], mode="constant")


def _iota(c: Converter, eqn: Any, ins: list[str]) -> str:
    p = eqn.params
    shape = tuple(p["shape"])
    ramp = np.arange(shape[p["dimension"]], dtype=np.dtype(p["dtype"]))
    view = [1] * len(shape)
    view[p["dimension"]] = shape[p["dimension"]]
    return c.const(np.broadcast_to(ramp.reshape(view), shape).copy(), hint="iota")


def _split(c: Converter, eqn: Any, ins: list[str]) -> list[str]:
    sizes = np.array(eqn.params["sizes"], np.int64)
    return c.op("Split", [ins[0], c.const(sizes)], n_out=len(sizes), axis=int(eqn.params["axis"]))


def _cumulative(c: Converter, eqn: Any, ins: list[str]) -> str:
    axis = c.const(np.array(eqn.params["axis"], np.int64))
    return c.op1("CumSum", [ins[0], axis], reverse=int(bool(eqn.params.get("reverse", False))))


def _unary_chain(*ops: str) -> Rule:
    def rule(c: Converter, eqn: Any, ins: list[str]) -> str:
        x = ins[0]
        for op_type in ops:
            x = c.op1(op_type, [x])
        return x

    return rule


def _with_one(op_type: str, post: str | None = None) -> Rule:
    """``log1p`` = Log(x + 1), ``expm1`` = Exp(x) - 1."""

    def rule(c: Converter, eqn: Any, ins: list[str]) -> str:
        one = c.const(np.ones((), aval(eqn.invars[0])[1]))
        if post is None:
            return c.op1(op_type, [c.op1("Add", [ins[0], one])])
        return c.op1(post, [c.op1(op_type, ins), one])

    return rule


RULES: dict[str, Rule] = {
    "add": _simple("Add"), "sub": _simple("Sub"), "mul": _simple("Mul"), "div": _simple("Div"),
    "max": _simple("Max"), "min": _simple("Min"), "pow": _simple("Pow"), "neg": _simple("Neg"),
    "exp": _simple("Exp"), "log": _simple("Log"), "tanh": _simple("Tanh"), "logistic": _simple("Sigmoid"),
    "sqrt": _simple("Sqrt"), "rsqrt": _unary_chain("Sqrt", "Reciprocal"), "abs": _simple("Abs"),
    "sign": _simple("Sign"), "erf": _simple("Erf"), "sin": _simple("Sin"), "cos": _simple("Cos"),
    "floor": _simple("Floor"), "ceil": _simple("Ceil"), "square": lambda c, e, i: c.op1("Mul", [i[0], i[0]]),
    "log1p": _with_one("Log"), "expm1": _with_one("Exp", "Sub"), "integer_pow": _integer_pow,
    "eq": _simple("Equal"), "lt": _simple("Less"), "le": _simple("LessOrEqual"), "gt": _simple("Greater"),
    "ge": _simple("GreaterOrEqual"), "ne": lambda c, e, i: c.op1("Not", [c.op1("Equal", i)]),
    "and": _simple("And"), "or": _simple("Or"), "not": _simple("Not"), "select_n": _select_n,
    "convert_element_type": _convert, "copy": _simple("Identity"), "copy_p": _simple("Identity"),
    "stop_gradient": _simple("Identity"), "optimization_barrier": lambda c, e, i: [c.op1("Identity", [x]) for x in i],
    "clamp": _clamp, "reshape": _to_out_shape, "squeeze": _to_out_shape, "expand_dims": _to_out_shape,
    "broadcast_in_dim": _broadcast_in_dim, "transpose": _transpose, "concatenate": _concatenate,
    "slice": _slice, "pad": _pad, "iota": _iota, "split": _split, "cumsum": _cumulative,
    "dot_general": _dot_general, "conv_general_dilated": _conv,
    "reduce_sum": _reduce("ReduceSum"), "reduce_max": _reduce("ReduceMax"), "reduce_min": _reduce("ReduceMin"),
    "reduce_prod": _reduce("ReduceProd"), "argmax": _argminmax("ArgMax"), "argmin": _argminmax("ArgMin"),
    "reduce_window_max": _reduce_window("MaxPool"), "reduce_window_sum": _reduce_window("AveragePool"),
}  # fmt: skip
