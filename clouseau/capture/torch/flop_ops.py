"""The FLOP category (:class:`clouseau.ir.flops.OpCategory`) of each torch op name.

An op of the torch frontend is a leaf module's type, lowercased (``linear``,
``batchnorm2d``, ``multiheadattention``), or a function or method name (``matmul``,
``addmm``, ``scaled_dot_product_attention``, in-place ``add_``), as fx, torch.export and
Dynamo name them. The IR builders store the category on each node; an op absent here has
no FLOP estimate.
"""

from __future__ import annotations

from clouseau.ir.flops import OpCategory

_FREE = frozenset({
    "input", "param", "parameter", "buffer", "constant", "getitem", "getattr", "size",
    "reshape", "view", "flatten", "unflatten", "transpose", "permute", "contiguous", "expand",
    "expand_as", "squeeze", "unsqueeze", "cat", "concat", "concatenate", "stack", "split",
    "chunk", "slice", "gather", "copy", "identity", "dropout", "to", "type", "float", "clone",
    "detach", "swapaxes", "pad", "flip", "roll", "repeat", "tile", "narrow", "select", "t",
    "zeros_like", "ones_like", "full", "zeros", "ones", "arange",
})  # fmt: skip
_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "truediv", "div", "floordiv", "pow", "neg", "abs", "relu", "relu6",
    "gelu", "silu", "swish", "sigmoid", "tanh", "exp", "exp2", "expm1", "log", "log1p",
    "sqrt", "rsqrt", "erf", "erfc", "sin", "cos", "max", "min", "maximum", "minimum", "where",
    "clamp", "clip", "hardtanh", "leakyrelu", "leaky_relu", "elu", "selu", "celu", "softplus",
    "softsign", "mish", "hardswish", "hardsigmoid", "sign", "square", "reciprocal", "rem",
    "mod", "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "not", "logical_and",
    "logical_or", "masked_fill", "lerp", "addcmul", "addcdiv", "glu", "sub_", "atan2", "cbrt",
    "ceil", "floor", "round",
})  # fmt: skip
_REDUCTIONS = frozenset({
    "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "var", "std", "norm",
    "logsumexp", "cumsum", "cumprod", "cummax", "all", "any", "count_nonzero",
})  # fmt: skip
_NORMS = {
    **dict.fromkeys(
        ("layernorm", "layer_norm", "groupnorm", "group_norm", "rmsnorm", "rms_norm",
         "instancenorm1d", "instancenorm2d", "instancenorm3d", "instance_norm"),
        OpCategory.NORM,
    ),
    **dict.fromkeys(
        ("batchnorm1d", "batchnorm2d", "batchnorm3d", "batch_norm"), OpCategory.BATCH_NORM
    ),
    **dict.fromkeys(("softmax", "log_softmax", "logsoftmax", "softmin"), OpCategory.SOFTMAX),
}  # fmt: skip
_MATMUL = frozenset({"linear", "matmul", "mm", "bmm", "einsum_mm"})
_ADDMM = frozenset({"addmm", "baddbmm", "addbmm"})
_ATTENTION = frozenset({"multiheadattention", "multi_head_attention_forward"})


def category(op: str) -> OpCategory | None:
    """The FLOP category of the torch op ``op``, or None (no estimate)."""
    op = op.lower()
    if op in _FREE:
        return OpCategory.FREE
    if op.startswith(("conv_transpose", "convtranspose")):
        return OpCategory.CONV_TRANSPOSE
    if op.startswith("conv"):
        return OpCategory.CONV
    if op in _MATMUL:
        return OpCategory.MATMUL
    if op in _ADDMM:
        return OpCategory.ADDMM
    if op in _ATTENTION:
        return OpCategory.ATTENTION
    if op == "scaled_dot_product_attention":
        return OpCategory.SDPA
    if op in _NORMS:
        return _NORMS[op]
    if "pool" in op:
        return OpCategory.POOL
    if op in _ELEMENTWISE or op.rstrip("_") in _ELEMENTWISE:
        return OpCategory.ELEMENTWISE
    if op in _REDUCTIONS:
        return OpCategory.REDUCTION
    return None
