"""What a fused attention kernel (``scaled_dot_product_attention``) is told, and reads.

A call's options are IR attrs (``tracing/ir_build.kernel_attrs``). Beside a computed pattern, the call
reads the pattern's bias of its boolean mask on a CPU (:func:`kernel_mask`): the float
mask the kernel converts a boolean one to on every call, computed once.
(torch's private flash op ``_scaled_dot_product_flash_attention_for_cpu`` also returns
the softmax's log-sum-exp, but ``exp(scores - lse)`` costs more than a softmax on a CPU,
whose ``exp`` is slower than the softmax's own: docs/canonical.md has the figures.)
"""

from __future__ import annotations

import torch
import torch.fx as fx

from clouseau.capture.torch.tracing.ir_build import SDPA_ARGS, sdpa_arguments

bound = sdpa_arguments  # a call's arguments by name


def kernel_mask(bias: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What a ``scaled_dot_product_attention`` call given boolean ``mask`` reads instead.

    On a CPU, ``bias`` (``computed._mask_bias``, shared with the pattern): the float mask the
    kernel converts a boolean one to on every call, so the same backend (its choice reads
    the mask's shape, not its dtype) computes on the same values, bitwise the same
    output, without the conversion. Elsewhere the mask itself (a GPU's backend choice may
    read the mask's dtype).
    """
    return bias if bias.device.type == "cpu" and mask.dtype == torch.bool else mask


def reads_mask(kernel: fx.Node | None, mask: fx.Node) -> bool:
    """Whether ``kernel`` is a ``scaled_dot_product_attention`` call given ``mask``
    (this fx node) without dropout."""
    name = str(getattr(kernel, "target", ""))
    if kernel is None or kernel.op != "call_function" or "scaled_dot_product_attention" not in name:
        return False
    args = bound(kernel)
    return args.get("attn_mask") is mask and float(args.get("dropout_p", 0.0) or 0.0) == 0.0


def read_mask(kernel: fx.Node, read: fx.Node) -> None:
    """Have ``kernel`` (see :func:`reads_mask`) read ``read`` as its mask."""
    if "attn_mask" in kernel.kwargs:
        kernel.update_kwarg("attn_mask", read)
    else:
        kernel.update_arg(SDPA_ARGS.index("attn_mask"), read)
