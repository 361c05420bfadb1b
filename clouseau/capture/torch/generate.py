"""``fmodel.generate(...)``: Hugging Face generation whose every forward step is captured.

``model.generate`` calls ``model(...)`` once per step: the prefill (the whole prompt),
then one decode step per new token, with the KV cache (``DynamicCache``) passed along.
While it runs, the model's ``forward`` is routed through the instrumented model, so each
step is one call of the capture, in order, and the tokens are the model's own. When the
selection picks module outputs only (:mod:`hooks_tier`), forward hooks capture each step
with no trace at all; an encoder-decoder's encoder run is then a call too. Otherwise steps
of one structure (the decode steps all alike) share one trace: the exported graph keeps
the sequence and cache lengths dynamic.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

import torch

# Flags generate passes that change nothing when they equal the config's own value; left
# out of a step, they keep the step's inputs free of **kwargs, which torch.export cannot
# give dynamic sizes alongside a cache.
_FLAGS = {
    "return_dict": "use_return_dict",
    "output_attentions": "output_attentions",
    "output_hidden_states": "output_hidden_states",
}


def generate(fmodel: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Run ``fmodel.model.generate(*args, **kwargs)`` with every forward step captured."""
    model = fmodel.model
    if not callable(getattr(model, "generate", None)):
        raise AttributeError(
            f"{type(model).__name__} has no generate(): fmodel.generate needs a Hugging Face "
            "generation model (GenerationMixin), such as GPT2LMHeadModel"
        )
    hooks = fmodel._hook_capture()
    if hooks is not None:  # module outputs only: forward hooks, no trace
        with hooks.installed((model, *_encoder(model))):
            return model.generate(*args, **kwargs)
    own = model.__dict__.get("forward")
    config = getattr(model, "config", None)

    # generate reads forward's signature to choose what it passes (position_ids built
    # from the attention mask, logits_to_keep): the step keeps the model's own signature,
    # or a left-padded batch would run with default positions, silently other values.
    @wraps(model.forward)
    def step(*a: Any, **kw: Any) -> Any:
        # The instrumented model traces and runs with the model's own forward.
        _set_forward(model, own)
        try:
            return fmodel(*a, **_plain(kw, config))
        finally:
            model.forward = step

    model.forward = step
    try:
        return model.generate(*args, **kwargs)
    finally:
        _set_forward(model, own)


def _encoder(model: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """An encoder-decoder's encoder: generate runs it once on its own, as a call."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return ()
    encoder = model.get_encoder()
    return (encoder,) if isinstance(encoder, torch.nn.Module) else ()


def _set_forward(model: torch.nn.Module, own: Any) -> None:
    if own is None:
        model.__dict__.pop("forward", None)
    else:
        model.forward = own


def _plain(kwargs: dict[str, Any], config: Any) -> dict[str, Any]:
    return {
        k: v
        for k, v in kwargs.items()
        if not (k in _FLAGS and isinstance(v, bool) and v == getattr(config, _FLAGS[k], None))
    }
