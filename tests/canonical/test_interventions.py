"""Interventions on canonical names: on a value the model holds they apply; on a fused
kernel's computed pattern or scores they replace the kernel by its decomposition, equal
to the same intervention patched into the eager attention (the derived views logit_lens
and head_out: tests/canonical/test_view_interventions.py)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import pytest
import torch

import clouseau
from clouseau.ir.graph import TraceKind
from clouseau.ir.verify import verify
from tests.canonical.families import BY_NAME, FAMILIES, Family, first_tensor

#: The decomposition (scores, softmax, pattern @ v as separate ops) rounds differently
#: from the fused kernel's blocked, online softmax; float32 rounding, through two blocks.
TOL = 1e-5


def test_an_intervention_on_a_canonical_name_changes_the_model_like_a_hook() -> None:
    family = BY_NAME["llama"]
    model = family.model()
    handle = model.model.layers[0].mlp.register_forward_hook(lambda m, a, out: out * 0.0)
    with torch.no_grad():
        want = model(**family.inputs()).logits
    handle.remove()
    fmodel = clouseau.instrument(
        model,
        select="blocks.0.resid_post",
        path=None,
        intervene={"blocks.0.mlp_out": clouseau.scale(0.0)},
    )
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(fmodel(**family.inputs()).logits, want)


@contextmanager
def _patched_softmax(
    layer: int, fn: Callable[[torch.Tensor], torch.Tensor], *, before: bool, blocks: int = 2
):
    """The eager attention's softmax of block ``layer`` (its ``layer``-th call of each
    forward of ``blocks`` blocks: GPT-2 and Llama call it once per block, nowhere else)
    with ``fn`` applied to its output (the pattern) or, ``before``, to its input."""
    real = torch.nn.functional.softmax
    calls = iter(range(1 << 30))

    def softmax(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if next(calls) % blocks != layer:
            return real(x, *args, **kwargs)
        return real(fn(x), *args, **kwargs) if before else fn(real(x, *args, **kwargs))

    torch.nn.functional.softmax = softmax
    try:
        yield
    finally:
        torch.nn.functional.softmax = real


def _ablate_head_1(pattern: torch.Tensor) -> torch.Tensor:
    out = pattern.clone()
    out[:, 1] = 0.0
    return out


def _uniform(pattern: torch.Tensor) -> torch.Tensor:
    """Each query attends equally to every key it may see (the masked ones stay zero)."""
    seen = (pattern > 0).to(pattern.dtype)
    return seen / seen.sum(-1, keepdim=True)


def _halve(scores: torch.Tensor) -> torch.Tensor:
    return scores * 0.5


def eager_twin(family: Family, model: torch.nn.Module) -> torch.nn.Module:
    """The family's eager-attention model with ``model``'s weights."""
    eager = family.model("eager")
    eager.load_state_dict(model.state_dict())
    return eager


def _eager_patched(family: Family, model: torch.nn.Module, layer: int, fn, before: bool):
    """The eager model's logits and attention weights with ``fn`` patched in."""
    eager = eager_twin(family, model)
    with torch.no_grad(), _patched_softmax(layer, fn, before=before):
        out = eager(**family.inputs(), output_attentions=True)
    return out.logits, out.attentions[layer]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize(
    ("name", "fn"),
    [("blocks.0.attn.pattern", _ablate_head_1), ("blocks.1.attn.pattern", _uniform),
     ("blocks.0.attn.scores", _halve)],
    ids=["ablate-head", "uniform", "scores"],
)  # fmt: skip
def test_an_intervention_on_a_computed_pattern_is_the_eager_patch(
    family: str, name: str, fn: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    fam = BY_NAME[family]
    model = fam.model("sdpa")
    layer, before = int(name.split(".")[1]), name.endswith("scores")
    want, weights = _eager_patched(fam, model, layer, fn, before)
    with torch.no_grad():
        plain = model(**fam.inputs()).logits
    pattern = f"blocks.{layer}.attn.pattern"
    fmodel = clouseau.instrument(
        model, select=[name, pattern], path=None, intervene={name: clouseau.replace(fn)}
    )
    for call in range(2):  # the first call (instrumented, not probed live) and a later one
        with torch.no_grad():
            got = fmodel(**fam.inputs()).logits
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
        assert (got - plain).abs().max() > 10 * TOL  # the intervention reached the outputs
        # The saved pattern is the one the model read: intervened, or the softmax of the
        # intervened scores.
        seen = torch.from_numpy(fmodel.captured.get(pattern, call=call))
        torch.testing.assert_close(seen, weights, rtol=0, atol=1e-6)
    verify(fmodel.captured.graph)


def test_an_intervention_on_a_computed_pattern_applies_at_every_generation_step() -> None:
    fam = BY_NAME["llama"]
    model = fam.model("sdpa")
    eager = eager_twin(fam, model)
    ids = fam.inputs()["input_ids"]
    kw = {"max_new_tokens": 3, "do_sample": False}
    with torch.no_grad(), _patched_softmax(0, _ablate_head_1, before=False):
        want = eager.generate(ids, **kw, output_logits=True, return_dict_in_generate=True)
    fmodel = clouseau.instrument(
        model, select="logits", path=None,
        intervene={"blocks.0.attn.pattern": clouseau.replace(_ablate_head_1)},
    )  # fmt: skip
    with torch.no_grad():
        got = fmodel.generate(ids, **kw)
    assert torch.equal(got, want.sequences)
    cap = fmodel.captured
    for step, logits in zip(cap.calls, want.logits, strict=True):
        last = torch.from_numpy(cap.get("logits", call=step))[:, -1]
        torch.testing.assert_close(last, logits, rtol=0, atol=TOL)


@pytest.mark.parametrize("fam", [f for f in FAMILIES if f.fused], ids=lambda f: f.name)
def test_an_identity_intervention_on_every_pattern_keeps_the_outputs(fam: Family) -> None:
    # Every family's kernel options (causal, grouped-query and multi-query heads, sliding
    # windows, T5's relative bias and cross-attention, no mask) through the decomposition.
    model = fam.model("sdpa")
    with torch.no_grad():
        plain = first_tensor(model(**fam.inputs()))
    fmodel = clouseau.instrument(
        model, select="resid_post", path=None, intervene={"pattern": clouseau.scale(1.0)}
    )
    for _ in range(2):
        with torch.no_grad():
            got = first_tensor(fmodel(**fam.inputs()))
        torch.testing.assert_close(got, plain, rtol=0, atol=TOL)


def test_scores_and_pattern_of_one_kernel_are_refused_together() -> None:
    family = BY_NAME["gpt2"]
    fmodel = clouseau.instrument(
        family.model(), select="resid_post", path=None,
        intervene={"blocks.0.attn.scores": clouseau.scale(0.5),
                   "blocks.0.attn.pattern": clouseau.scale(2.0)},
    )  # fmt: skip
    with pytest.raises(clouseau.SelectionError, match=r"both.*one clouseau.replace"):
        fmodel(**family.inputs())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_padded_batch_keeps_its_outputs_through_the_decomposition(family: str) -> None:
    fam = BY_NAME[family]
    model = fam.model("sdpa")
    eager = eager_twin(fam, model)
    ids = torch.tensor([[5, 17, 42, 8, 33, 3], [1, 1, 42, 8, 33, 3]])
    inputs = {"input_ids": ids, "attention_mask": torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])}
    with torch.no_grad():
        plain = model(**inputs).logits
        weights = eager(**inputs, output_attentions=True).attentions[0]
    fmodel = clouseau.instrument(
        model, select="blocks.0.attn.pattern", path=None,
        intervene={"pattern": clouseau.scale(1.0)},
    )  # fmt: skip
    with torch.no_grad():
        got = fmodel(**inputs).logits
    # A padding query attends to nothing: its pattern row is 0 (the kernel's output for
    # it), not NaN, so nothing spreads to the other positions through their values.
    torch.testing.assert_close(got, plain, rtol=0, atol=TOL)
    pattern = torch.from_numpy(fmodel.captured["blocks.0.attn.pattern"])
    torch.testing.assert_close(pattern[0], weights[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(pattern[1, :, 2:], weights[1, :, 2:], rtol=0, atol=1e-6)
    assert torch.equal(pattern[1, :, :2], torch.zeros_like(pattern[1, :, :2]))


class _Branchy(torch.nn.Module):
    """A language model whose output takes a data-dependent branch: neither torch.fx nor
    torch.export traces it, so it runs in the dynamic (TorchDynamo) tier."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.lm(input_ids=input_ids, use_cache=False).logits
        return logits * 2.0 if logits.mean() > 0 else -logits


def test_an_intervention_on_a_computed_pattern_in_the_dynamic_tier_is_the_eager_patch() -> None:
    from clouseau.capture.torch.runtime.tiers import Tier

    fam = BY_NAME["gpt2"]
    model = fam.model("sdpa")
    ids = fam.inputs()["input_ids"]
    eager = eager_twin(fam, model)
    with torch.no_grad(), _patched_softmax(0, _ablate_head_1, before=False):
        want = _Branchy(eager)(ids)
        weights = eager(input_ids=ids, output_attentions=True).attentions[0]
    with torch.no_grad():
        plain = _Branchy(model)(ids)
    fmodel = clouseau.instrument(
        _Branchy(model), select="blocks.0.attn.pattern", path=None,
        intervene={"blocks.0.attn.pattern": clouseau.replace(_ablate_head_1)},
    )  # fmt: skip
    tier = Tier.DYNAMO.value.replace("(", r"\(").replace(")", r"\)")
    for call in range(2):
        warns = pytest.warns(UserWarning, match=tier) if call == 0 else nullcontext()
        with torch.no_grad(), warns:
            got = fmodel(ids)
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
        assert (got - plain).abs().max() > 10 * TOL  # the intervention reached the outputs
        seen = torch.from_numpy(fmodel.captured.get("blocks.0.attn.pattern", call=call))
        torch.testing.assert_close(seen, weights, rtol=0, atol=1e-6)
    assert {g.trace_kind for g in fmodel.captured.graphs} == {TraceKind.TORCH_DYNAMO}
