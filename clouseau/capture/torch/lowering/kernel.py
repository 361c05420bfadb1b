"""What a fused attention kernel (``scaled_dot_product_attention``) is told, and reads.

:func:`kernel_attrs` records a call's options as IR attrs (what a computed pattern
needs: its scale, causality, mask and dropout). Beside a computed pattern, the call
reads the pattern's bias of its boolean mask on a CPU (:func:`kernel_mask`): the float
mask the kernel converts a boolean one to on every call, computed once.
(torch's private flash op ``_scaled_dot_product_flash_attention_for_cpu`` also returns
the softmax's log-sum-exp, but ``exp(scores - lse)`` costs more than a softmax on a CPU,
whose ``exp`` is slower than the softmax's own: docs/canonical.md has the figures.)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from clouseau.ir.graph import AttrValue

_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def kernel_attrs(fx_node: fx.Node, op: str) -> tuple[tuple[str, AttrValue], ...]:
    """The options of a ``scaled_dot_product_attention`` call, as IR attrs (else none)."""
    if op != "scaled_dot_product_attention" or fx_node.op != "call_function":
        return ()
    args = bound(fx_node)
    nodes = [a for a in fx_node.args[:3] if isinstance(a, fx.Node)]
    mask = args.get("attn_mask")
    scale = args.get("scale")
    if len(nodes) != 3 or not (scale is None or isinstance(scale, int | float)):
        return ()
    return (
        ("scale", None if scale is None else float(scale)),
        ("is_causal", bool(args.get("is_causal", False))),
        ("mask", 3 if isinstance(mask, fx.Node) else -1),
        ("dropout_p", float(args.get("dropout_p", 0.0) or 0.0)),
        ("enable_gqa", bool(args.get("enable_gqa", False))),
    )


def bound(fx_node: fx.Node) -> dict[str, Any]:
    """A ``scaled_dot_product_attention`` call's arguments by name."""
    return dict(zip(_SDPA_ARGS, fx_node.args, strict=False)) | dict(fx_node.kwargs)


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
        kernel.update_arg(_SDPA_ARGS.index("attn_mask"), read)
