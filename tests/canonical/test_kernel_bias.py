"""A computed pattern's mask bias, shared by every attention reading the mask and by the
fused kernel itself on a CPU: the kernel's outputs stay bitwise (the framework's own
conversion of a boolean mask gives the same values), the pattern the eager weights."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import clouseau
from clouseau.capture.torch.lowering.computed import _mask_bias
from clouseau.capture.torch.lowering.kernel import kernel_mask
from clouseau.capture.torch.lowering.lower import lower
from tests.canonical.families import FAMILIES, first_tensor

GPT2 = next(f for f in FAMILIES if f.name == "gpt2")


def _targets(gm: torch.fx.GraphModule, fn: object) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is fn]


def _masks(kind: str, b: int, q: int, k: int) -> torch.Tensor:
    torch.manual_seed(1)
    if kind == "causal":  # materialized per batch, as transformers builds GPT-2's
        return torch.ones(q, k, dtype=torch.bool).tril(k - q).expand(b, 1, q, k).clone()
    if kind == "padding":  # a [batch, 1, 1, key] mask expanded over queries (stride 0)
        return (torch.rand(b, 1, 1, k) > 0.3).expand(b, 1, q, k)
    if kind == "2d":
        return torch.ones(q, k, dtype=torch.bool).tril(k - q)
    return torch.rand(b, 1, q, k) > 0.5  # rows the mask empties


@pytest.mark.parametrize(
    ("dtype", "backend"),
    list(
        itertools.product(
            (torch.float32, torch.bfloat16, torch.float16, torch.float64), (None, "math")
        )
    ),
)
def test_sdpa_reads_the_bias_of_a_boolean_mask_bitwise(
    dtype: torch.dtype, backend: str | None
) -> None:
    # The rule's premise, against the framework: SDPA given a boolean mask computes what it
    # computes given that mask's -inf bias (on the flash kernel and the math fallback,
    # grouped-query heads, rows the mask empties, compact biases that broadcast).
    for (heads, kv_heads, q, k), kind in itertools.product(
        ((4, 4, 5, 5), (4, 2, 7, 7), (2, 2, 1, 9), (4, 4, 33, 33)),
        ("causal", "padding", "2d", "empty"),
    ):
        torch.manual_seed(0)
        query = torch.randn(2, heads, q, 16, dtype=dtype)
        key, value = (torch.randn(2, kv_heads, k, 16, dtype=dtype) for _ in range(2))
        mask = _masks(kind, 2, q, k)
        bias = _mask_bias(mask, dtype)
        assert bias.numel() <= mask.numel()
        gqa = heads != kv_heads
        with sdpa_kernel(SDPBackend.MATH) if backend else torch.no_grad():
            want = F.scaled_dot_product_attention(query, key, value, mask, enable_gqa=gqa)
            got = F.scaled_dot_product_attention(query, key, value, bias, enable_gqa=gqa)
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (kind, heads, q)


def test_kernel_reads_the_boolean_mask_off_a_cpu() -> None:
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool).tril()
    bias = _mask_bias(mask, torch.float32)
    assert kernel_mask(bias, mask) is bias
    # A GPU's backend choice may read the mask's dtype: there the kernel keeps its mask.
    meta_mask, meta_bias = mask.to("meta"), bias.to("meta")
    assert kernel_mask(meta_bias, meta_mask) is meta_mask
    floats = torch.zeros(1, 1, 3, 3)  # a float mask is the kernel's own: never swapped
    assert kernel_mask(bias, floats) is floats


def test_gpt2_mask_bias_built_once_and_read_by_each_kernel() -> None:
    model = GPT2.model("sdpa")
    with torch.no_grad():
        plain = first_tensor(model(**GPT2.inputs()))
    lowered = lower(model, (), GPT2.inputs(), ["blocks.*.attn.pattern"])
    gm = lowered.module
    (bias,) = _targets(gm, _mask_bias)  # one mask, two blocks: one bias
    (swap,) = _targets(gm, kernel_mask)
    kernels = [n for n in gm.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    assert len(kernels) == model.config.n_layer
    for kernel in kernels:
        assert swap in kernel.all_input_nodes and bias not in kernel.all_input_nodes
    fmodel = clouseau.instrument(model, select=["blocks.*.attn.pattern"], path=None)
    eager = GPT2.model("eager")
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        weights = eager(**GPT2.inputs(), output_attentions=True).attentions
        for call in range(2):  # the probed call, then the lowered graph
            assert torch.equal(first_tensor(fmodel(**GPT2.inputs())), plain)
            for i, w in enumerate(weights):
                got = torch.from_numpy(fmodel.captured.get(f"blocks.{i}.attn.pattern", call=call))
                torch.testing.assert_close(got, w, rtol=0, atol=1e-6)
