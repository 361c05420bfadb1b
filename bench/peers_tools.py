"""How each peer captures the same points, for bench/bench_peers.py.

Every function here builds a :class:`~bench.harness.Variant` whose step returns what the
tool captured as ``{name: tensor}`` (or a list of them per generate step), so that the
values can be compared with forward hooks on the eager model before anything is timed.
A tool that is not installed, or fails on the model, becomes a skipped variant naming why.
"""

from __future__ import annotations

import copy
import functools
import importlib
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from bench.harness import Variant, skipped

Captured = dict[str, torch.Tensor]

PINS = {
    "nnsight": "nnsight==0.8.1",
    "transformer_lens": "transformer-lens==4.3.0",
    "torchlens": "torchlens==2.36.1",
}


def gpt2(layers: int, width: int) -> nn.Module:
    """A GPT-2 LM with eager attention (what TransformerBridge runs too), fixed seed."""
    importlib.import_module("tests.conftest")  # torchvision's schemas, before transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=layers, n_head=4, n_embd=width, vocab_size=1000, n_positions=512,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    config._attn_implementation = "eager"
    return GPT2LMHeadModel(config).eval()


def module_names(layers: int) -> list[str]:
    """The 12 module outputs (for 6 layers), in execution order: each attention's output
    projection, then the MLP."""
    return [f"transformer.h.{i}.{m}" for i in range(layers) for m in ("attn.c_proj", "mlp")]


def missing(module: str) -> str | None:
    """Why ``module`` cannot be imported (a line for the report), or None."""
    try:
        importlib.import_module(module)
    except Exception as err:
        return f"{module} is not installed ({type(err).__name__}); `pip install {PINS[module]}`"
    return None


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_clone(v) for v in value)
    return value


# -- raw forward hooks ---------------------------------------------------------------------------
class Hooks:
    """Forward hooks registered once, each cloning its module's output into a log."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        self.log: list[tuple[str, Any]] = []
        self.handles = [model.get_submodule(n).register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, out: Any) -> None:
            self.log.append((name, _clone(out)))

        return hook

    def take(self) -> list[tuple[str, Any]]:
        """What the hooks saved since the last take, in order (a name per module call)."""
        out, self.log = self.log, []
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def hooks_variant(
    name: str, run: Callable[[], Any], model: nn.Module, names: Sequence[str]
) -> Variant:
    """``run()`` with raw hooks on ``names`` registered once; the step returns the clones."""
    hooks = Hooks(model, names)

    def step() -> Captured:
        run()
        return dict(hooks.take())

    return Variant(name, step=step, close=hooks.close, note=f"{len(names)} modules")


def execution_order(model: nn.Module, run: Callable[[], Any]) -> list[str]:
    """Every named module in the order its forward returns (what nnsight must follow)."""
    order: list[str] = []
    handles = [
        m.register_forward_hook(lambda _m, _a, _o, n=n: order.append(n))
        for n, m in model.named_modules()
        if n
    ]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return list(dict.fromkeys(order))


# -- nnsight ----------------------------------------------------------------------------------------
def nnsight_variant(
    name: str, model: nn.Module, inputs: tuple[Any, ...], names: Sequence[str]
) -> Variant:
    """``NNsight(model).trace(*inputs)`` saving ``.output`` of ``names`` (execution order)."""
    why = missing("nnsight")
    if why:
        return skipped(name, why)
    from nnsight import NNsight

    wrapped = NNsight(model)
    envoys = [functools.reduce(_envoy, n.split("."), wrapped) for n in names]

    def step() -> Captured:
        saved: list[Any] = []
        with wrapped.trace(*inputs):
            for envoy in envoys:
                saved.append(envoy.output.save())
        return dict(zip(names, saved, strict=True))

    return Variant(name, step=step, note=f"{len(names)} modules")


def nnsight_language_model(model: nn.Module) -> Any:
    """nnsight's ``TransformersModel`` over an already built Hugging Face causal LM.

    A bare ``NNsight(model)`` has no generate of its own (``.generate`` is the model's,
    which returns tokens, not a tracer); ``TransformersModel`` generates under a trace but
    builds a text-generation pipeline, which wants a tokenizer. The inputs here are token
    ids, so a word-level tokenizer over the model's vocabulary, made in memory, serves
    (nothing is downloaded; it never tokenizes anything).
    """
    import tokenizers
    import transformers
    from nnsight.modeling.transformers import TransformersModel

    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="t0", eos_token="t0"
    )
    return TransformersModel(model, task="text-generation", tokenizer=tokenizer)


def _envoy(parent: Any, part: str) -> Any:
    return parent[int(part)] if part.isdigit() else getattr(parent, part)


# -- TransformerLens TransformerBridge --------------------------------------------------------------
def bridge_hook(name: str) -> str:
    """The bridge's hook of a GPT-2 module output (``attn.c_proj`` is its ``attn.o``)."""
    layer, module = name.removeprefix("transformer.h.").split(".", 1)
    return f"blocks.{layer}.{'attn.o' if module == 'attn.c_proj' else module}.hook_out"


def bridge(model: nn.Module) -> Any:
    """A TransformerBridge over a copy of ``model`` (the bridge rewires the model it wraps).

    ``build_bridge_from_module`` wraps an existing Hugging Face model with its config: no
    download, no tokenizer.
    """
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    twin = copy.deepcopy(model)
    return build_bridge_from_module(twin, type(twin).__name__, hf_config=twin.config)


def bridge_variant(
    name: str, tl_bridge: Any, ids: torch.Tensor, hooks: Sequence[str] | None
) -> Variant:
    """``run_with_cache`` of the bridge, keeping ``hooks`` (None: every hook)."""
    wanted = None if hooks is None else frozenset(hooks)

    def step() -> Captured:
        if wanted is None:
            _, cache = tl_bridge.run_with_cache(ids)
        else:
            _, cache = tl_bridge.run_with_cache(ids, names_filter=lambda n: n in wanted)
        return dict(cache.items())

    return Variant(name, step=step, note="every hook" if hooks is None else f"{len(hooks)} hooks")


# -- TorchLens ----------------------------------------------------------------------------------------
def torchlens_variant(
    name: str, model: nn.Module, inputs: tuple[Any, ...], names: Sequence[str] | None
) -> Variant:
    """``tl.trace`` saving the outputs of the modules ``names`` (None: every op)."""
    why = missing("torchlens")
    if why:
        return skipped(name, why)
    import torchlens as tl

    save = None if names is None else functools.reduce(operator.or_, [tl.module(n) for n in names])

    def step() -> Captured:
        log = tl.trace(model, *inputs) if save is None else tl.trace(model, *inputs, save=save)
        if names is None:
            return {"__ops__": torch.tensor(len(log.layer_labels))}
        return {n: log.modules[n].out for n in names}

    return Variant(name, step=step, note="every op" if names is None else f"{len(names)} modules")
