"""The FLOP category (:class:`clouseau.ir.flops.OpCategory`) of each JAX op name.

An op of the JAX frontend is a primitive (``dot_general``, ``reduce_sum``), a ``jax.nn``
activation (``relu``, ``softmax``: :data:`~clouseau.capture.jax.naming.ACTIVATIONS`), a
JAX library function kept as one op (``clip``, ``logsumexp``, ``where``) or one of the
frontend's own nodes (``scan_carry``). :mod:`~clouseau.capture.jax.build` stores the
category on each node; an op absent here has no FLOP estimate.
"""

from __future__ import annotations

from clouseau.ir.flops import OpCategory

_FREE = frozenset({
    "input", "param", "const", "reshape", "transpose", "squeeze", "squeeze_p", "expand_dims",
    "concatenate", "concat", "stack", "split", "broadcast_in_dim", "convert_element_type", "slice",
    "dynamic_slice", "dynamic_update_slice", "gather", "copy", "copy_p", "rev", "pad", "iota",
    "swapaxes", "flip", "roll", "repeat", "tile", "select", "stop_gradient", "zeros_like",
    "ones_like", "full", "zeros", "ones", "arange", "identity", "scan_carry", "scan_slice",
})  # fmt: skip
_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "pow", "integer_pow", "neg", "abs", "relu", "relu6", "gelu",
    "silu", "swish", "sigmoid", "logistic", "tanh", "exp", "exp2", "expm1", "log", "log1p",
    "sqrt", "rsqrt", "erf", "erfc", "sin", "cos", "max", "min", "maximum", "minimum", "where",
    "select_n", "clamp", "clip", "leaky_relu", "elu", "selu", "celu", "softplus", "softsign",
    "mish", "sign", "square", "reciprocal", "rem", "mod", "eq", "ne", "lt", "le", "gt", "ge",
    "not", "logical_and", "logical_or", "glu", "atan2", "cbrt", "ceil", "floor", "round",
})  # fmt: skip
_REDUCTIONS = frozenset({
    "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "var", "std", "norm",
    "logsumexp", "cumsum", "cumprod", "reduce_sum", "reduce_max", "reduce_min",
    "reduce_prod", "reduce_and", "reduce_or", "argmax_p", "cumlogsumexp", "cummax", "all",
    "any", "count_nonzero",
})  # fmt: skip
_NORMS = {
    "layer_norm": OpCategory.NORM, "group_norm": OpCategory.NORM,
    "rms_norm": OpCategory.NORM, "batch_norm": OpCategory.BATCH_NORM,
    "softmax": OpCategory.SOFTMAX, "log_softmax": OpCategory.SOFTMAX,
}  # fmt: skip


def category(op: str) -> OpCategory | None:
    """The FLOP category of the JAX op ``op``, or None (no estimate)."""
    op = op.lower()
    if op in _FREE:
        return OpCategory.FREE
    if op == "scan":
        return OpCategory.LOOP
    if op == "dot_general":
        return OpCategory.DOT_GENERAL
    if op == "matmul":  # jnp.matmul when JAX keeps it as one jitted function
        return OpCategory.MATMUL
    if op.startswith("conv_transpose"):
        return OpCategory.CONV_TRANSPOSE
    if op.startswith("conv"):
        return OpCategory.CONV
    if op in _NORMS:
        return _NORMS[op]
    if op == "dot_product_attention":  # the kernel's node: its body's nodes count
        return OpCategory.FREE
    if "pool" in op:
        return OpCategory.POOL
    if op.startswith("reduce_window"):
        return OpCategory.REDUCE_WINDOW
    if op in _ELEMENTWISE:
        return OpCategory.ELEMENTWISE
    if op in _REDUCTIONS:
        return OpCategory.REDUCTION
    return None
