"""A fixed, diverse sample of the model zoo, through the sweep's own checks.

Each case is built from its tiny random config (no download) and checked as the sweep
checks it (bench/zoo/check_torch.py, check_jax.py): outputs and every module output equal
eager, two calls at two shapes with at most 2 traces, ``generate`` tokens equal. The full
sweep is ``./dev.sh zoo``, not a test; its table is docs/models.md.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.zoo.outcome import Status

# case id -> what it stands for (modality, family, tier the sweep saw it take)
SAMPLE = {
    # JAX: every case (Flax NNX, Equinox, Flax linen)
    "jax:nnx-transformer": "text: NNX attention block",
    "jax:nnx-cnn": "vision: NNX conv + BatchNorm",
    "jax:nnx-rnn-scan": "sequence: NNX RNN under nnx.scan",
    "jax:eqx-mlp": "Equinox MLP under vmap",
    "jax:eqx-conv2d-sequential": "vision: Equinox Conv2d in Sequential",
    "jax:eqx-multihead-attention": "text: Equinox MultiheadAttention",
    "jax:eqx-batchnorm-state": "Equinox BatchNorm with eqx.nn.State under vmap(axis_name)",
    "jax:linen-apply": "vision: Flax linen through model.apply",
    # torchvision
    "torchvision:resnet18": "vision classification, torch.fx",
    "torchvision:quantized_mobilenet_v2": "quantizable classification, torch.fx",
    "torchvision:r3d_18": "video classification, torch.fx",
    "torchvision:squeezenet1_1": "vision classification, torch.fx",
    # timm
    "timm:resnet18": "vision CNN, torch.fx",
    "timm:test_vit": "vision transformer",
    "timm:test_convnext": "vision ConvNeXt",
    # transformers
    "transformers:gpt2/causal-lm": "text decoder, torch.export, generate",
    "transformers:llama/causal-lm": "text decoder (RoPE, GQA), torch.export, generate",
    "transformers:mamba/causal-lm": "state-space decoder, torch.export, generate",
    "transformers:bert/masked-lm": "text encoder, torch.export",
    "transformers:bart/seq2seq-lm": "text encoder-decoder, generate",
    "transformers:vit/image-classification": "vision transformer, torch.export",
    "transformers:clip/base": "multimodal dual encoder (text and image)",
    "transformers:rwkv/causal-lm": "recurrent decoder, a state written in place per layer",
    "transformers:qwen2_audio/seq2seq-lm": "audio-text decoder, a module returns its input",
    "transformers:reformer/base": "LSH attention, a cache rebuilt with other contents",
}


@pytest.mark.parametrize("case_id", list(SAMPLE))
def test_sample_model_equals_eager(case_id: str) -> None:
    pytest.importorskip("torch" if not case_id.startswith("jax:") else "jax")
    from bench.zoo import catalog

    outcome = catalog.run(case_id)
    assert outcome.status in (Status.BITWISE, Status.TOLERANCE), (outcome.status, outcome.detail)
    assert outcome.points > 0 and outcome.traces <= 2
    if outcome.status is Status.TOLERANCE:
        assert outcome.family == "jax"  # PyTorch is bit for bit
    if case_id.endswith(("causal-lm", "seq2seq-lm")):
        assert outcome.generate == "equal"


# case id -> what it stands for; the model neither tracer takes: TorchDynamo's regions
DYNAMO_SAMPLE = {
    "transformers:longformer/masked-lm": "text encoder, sliding-window attention, dynamic tier",
}


@pytest.mark.parametrize("case_id", list(DYNAMO_SAMPLE))
def test_sample_untraceable_model_takes_the_dynamic_tier(case_id: str) -> None:
    pytest.importorskip("torch")
    from bench.zoo import catalog
    from clouseau.ir import TraceKind

    outcome = catalog.run(case_id)
    assert outcome.status is Status.BITWISE, (outcome.status, outcome.detail)
    assert outcome.tier == TraceKind.TORCH_DYNAMO.value and outcome.points > 0


# case id -> module-output globs: a selection of module outputs alone takes the hooks tier
HOOKS_SAMPLE = {
    "torchvision:resnet18": ("layer*.0", "layer*.1"),  # every residual block, no trace
}


@pytest.mark.parametrize(("case_id", "select"), list(HOOKS_SAMPLE.items()))
def test_sample_module_outputs_take_the_hooks_tier(case_id: str, select: tuple[str, ...]) -> None:
    pytest.importorskip("torch")
    from bench.zoo import catalog, check_torch
    from clouseau.ir import TraceKind

    build = catalog.torch_builder(case_id)
    family, key = case_id.split(":", 1)
    outcome = check_torch.run_case(lambda: replace(build(), select=select), family, key)
    assert outcome.status is Status.BITWISE, (outcome.status, outcome.detail)
    assert outcome.tier == TraceKind.TORCH_HOOKS.value
    assert outcome.points >= len(select) and outcome.traces == 0
