"""Built-in torch.nn modules that torch.fx traces through on their Python path.

torch.fx keeps every built-in ``torch.nn`` module a leaf, so the submodules of
``nn.TransformerEncoder`` and ``nn.TransformerEncoderLayer`` (attention, norms, linears)
would be no points on the traced path, while forward hooks see each of them. Their
``forward`` has a fused fast path (``torch._transformer_encoder_layer_fwd``) that fx cannot
trace, as it chooses on tensor properties; eager takes their Python path whenever a
forward hook is attached to them or to a submodule, so that path is the one whose module
outputs exist. The tracer takes it too: the layers of the encoder become calls, their
submodules points, each equal to a forward hook on eager.

Only a call without masks is traced through (a mask's dtype and causality are checked on
its values); with one the module stays a leaf, its submodules no points, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def python_path(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[..., Any] | None:
    """The forward the tracer runs for a built-in it traces through, None for a leaf."""
    if isinstance(module, torch.nn.TransformerEncoderLayer):
        if _masked(args[1:3], kwargs, ("src_mask", "src_key_padding_mask")):
            return None
        return _without_fast_path(module.forward)
    if isinstance(module, torch.nn.TransformerEncoder):
        if _masked(args[1:3], kwargs, ("mask", "src_key_padding_mask")):
            return None
        return lambda src, mask=None, src_key_padding_mask=None, is_causal=None: _encoder(
            module, src, is_causal
        )
    return None


def _masked(positional: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...]) -> bool:
    return any(a is not None for a in positional) or any(kwargs.get(n) is not None for n in names)


def _without_fast_path(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` with the fused path off while fx traces it (``torch.backends.mha``'s
    switch, the one the layer reads first: its other checks would read proxies)."""

    def traced(*args: Any, **kwargs: Any) -> Any:
        enabled = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            return forward(*args, **kwargs)
        finally:
            torch.backends.mha.set_fastpath_enabled(enabled)

    return traced


def _encoder(encoder: torch.nn.TransformerEncoder, src: Any, is_causal: bool | None) -> Any:
    """``nn.TransformerEncoder.forward`` without masks, as eager runs it off the fast path
    (no nested tensors): its layers in turn, then its norm. Its own forward reads the
    sequence length through ``src.is_nested``, which fx cannot trace; without a mask, the
    causality it detects is ``is_causal is True``."""
    output = src
    for layer in encoder.layers:
        output = layer(
            output, src_mask=None, is_causal=is_causal is True, src_key_padding_mask=None
        )
    return output if encoder.norm is None else encoder.norm(output)
