"""Small transformers of many families, and where forward hooks see their residual stream.

Each :class:`Family` says which modules a hand computation hooks (the block list, the
module whose output is what attention adds to the stream, the MLP's) and how the block
adds them (``"seq"``: attention then MLP; ``"parallel"``: both read the block's input;
``"post"``: a norm after each add). The canonical names come from clouseau's inference;
these tables only say where to look with hooks to check them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

transformers = __import__("pytest").importorskip("transformers")
T = transformers

V = 64
IDS = torch.tensor([[5, 17, 42, 8, 33, 3]])
D = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
     "num_hidden_layers": 2, "vocab_size": V, "max_position_embeddings": 32}  # fmt: skip


@dataclass(frozen=True)
class Family:
    """A model builder and the module paths (relative to a block) hooks read."""

    name: str
    build: Callable[[str], torch.nn.Module]  # attn_implementation -> model
    blocks: tuple[str, ...]  # block-list module paths (encoder's first)
    attn: str  # module whose output is attn_out
    mlp: str  # module whose output is mlp_out
    kind: str = "seq"
    inputs: Callable[[], dict[str, Any]] = field(default=lambda: {"input_ids": IDS})
    pos_embed: bool = False
    ln_final: bool = True
    logits: bool = True
    prefixes: tuple[str, ...] = ("",)
    fused: bool = True  # transformers runs the family's attention through SDPA

    def model(self, attention: str = "sdpa") -> torch.nn.Module:
        """The model in eval mode, with SDPA where the family has it (else eager)."""
        return self.build(attention if self.fused else "eager").eval()


def _t5_inputs() -> dict[str, Any]:
    return {"input_ids": IDS, "decoder_input_ids": IDS[:, :4]}


def _vit_inputs() -> dict[str, Any]:
    torch.manual_seed(1)
    return {"pixel_values": torch.randn(1, 3, 16, 16)}


def _cfg(cls: Any, attn: str, **kw: Any) -> Any:
    torch.manual_seed(0)
    config = cls(**kw)
    config._attn_implementation = attn
    return config


FAMILIES = (
    Family("gpt2", lambda a: T.GPT2LMHeadModel(_cfg(T.GPT2Config, a, n_layer=2, n_embd=32,
           n_head=4, vocab_size=V, n_positions=32)), ("transformer.h",), "attn", "mlp",
           pos_embed=True),
    Family("llama", lambda a: T.LlamaForCausalLM(_cfg(T.LlamaConfig, a, num_key_value_heads=2,
           **D)), ("model.layers",), "self_attn", "mlp"),
    Family("mistral", lambda a: T.MistralForCausalLM(_cfg(T.MistralConfig, a,
           num_key_value_heads=2, sliding_window=3, **D)), ("model.layers",), "self_attn", "mlp"),
    Family("qwen2", lambda a: T.Qwen2ForCausalLM(_cfg(T.Qwen2Config, a, num_key_value_heads=2,
           **D)), ("model.layers",), "self_attn", "mlp"),
    Family("gemma2", lambda a: T.Gemma2ForCausalLM(_cfg(T.Gemma2Config, a, num_key_value_heads=2,
           head_dim=8, attn_logit_softcapping=5.0, final_logit_softcapping=3.0, **D)),
           ("model.layers",), "post_attention_layernorm", "post_feedforward_layernorm",
           fused=False),
    Family("phi", lambda a: T.PhiForCausalLM(_cfg(T.PhiConfig, a, **D)), ("model.layers",),
           "self_attn", "mlp", kind="parallel"),
    Family("gpt_neox", lambda a: T.GPTNeoXForCausalLM(_cfg(T.GPTNeoXConfig, a, **D)),
           ("gpt_neox.layers",), "attention", "mlp", kind="parallel"),
    Family("opt", lambda a: T.OPTForCausalLM(_cfg(T.OPTConfig, a, hidden_size=32,
           num_attention_heads=4, ffn_dim=64, num_hidden_layers=2, vocab_size=V,
           max_position_embeddings=32, word_embed_proj_dim=32)), ("model.decoder.layers",),
           "self_attn", "fc2", pos_embed=True),
    Family("falcon", lambda a: T.FalconForCausalLM(_cfg(T.FalconConfig, a, hidden_size=32,
           num_attention_heads=4, num_hidden_layers=2, vocab_size=V)), ("transformer.h",),
           "self_attention", "mlp", kind="parallel"),
    Family("bloom", lambda a: T.BloomForCausalLM(_cfg(T.BloomConfig, a, hidden_size=32, n_head=4,
           n_layer=2, vocab_size=V)), ("transformer.h",), "self_attention.dense",
           "mlp.dense_4h_to_h", fused=False),
    Family("bert", lambda a: T.BertForMaskedLM(_cfg(T.BertConfig, a, **D)),
           ("bert.encoder.layer",), "attention.output.dense", "output.dense", kind="post",
           pos_embed=True, ln_final=False),
    Family("t5", lambda a: T.T5ForConditionalGeneration(_cfg(T.T5Config, a, vocab_size=V,
           d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)),
           ("encoder.block", "decoder.block"), "layer.0.SelfAttention", "layer.-1.DenseReluDense",
           inputs=_t5_inputs, prefixes=("encoder.", "decoder.")),
    Family("vit", lambda a: T.ViTModel(_cfg(T.ViTConfig, a, hidden_size=32, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=8)),
           ("layers",), "attention", "mlp", inputs=_vit_inputs, logits=False),
)  # fmt: skip
BY_NAME = {f.name: f for f in FAMILIES}


def submodule(block: torch.nn.Module, path: str) -> torch.nn.Module:
    """``block``'s submodule at ``path``, where ``-1`` is the last of a list."""
    module = block
    for part in path.split("."):
        module = module[int(part)] if part.lstrip("-").isdigit() else getattr(module, part)
    return module


def first_tensor(value: Any) -> torch.Tensor:
    while not isinstance(value, torch.Tensor):
        value = value[0]
    return value


def hooked(model: torch.nn.Module, family: Family) -> dict[str, torch.Tensor]:
    """One eager call's block inputs and outputs, attention and MLP outputs, by canonical name."""
    seen: dict[str, torch.Tensor] = {}
    handles = []

    def keep(name: str, pre: bool = False) -> Callable[..., None]:
        def hook(module: Any, args: Any, kwargs: Any, out: Any = None) -> None:
            value = (args[0] if args else kwargs["hidden_states"]) if pre else first_tensor(out)
            seen.setdefault(name, value.detach().clone())

        return hook

    for prefix, blocks in zip(family.prefixes, family.blocks, strict=True):
        for i, block in enumerate(model.get_submodule(blocks)):
            base = f"{prefix}blocks.{i}"
            handles += [
                block.register_forward_pre_hook(keep(f"{base}.resid_pre", True), with_kwargs=True),
                block.register_forward_hook(keep(f"{base}.resid_post"), with_kwargs=True),
                submodule(block, family.attn).register_forward_hook(
                    keep(f"{base}.attn_out"), with_kwargs=True
                ),
                submodule(block, family.mlp).register_forward_hook(
                    keep(f"{base}.mlp_out"), with_kwargs=True
                ),
            ]
    try:
        with torch.no_grad():
            seen["logits" if family.logits else "output"] = first_tensor(
                model(**family.inputs())
            ).clone()
    finally:
        for handle in handles:
            handle.remove()
    return seen
