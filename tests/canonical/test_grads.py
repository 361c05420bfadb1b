"""``grads=`` on torch computed points: the gradient of a pattern (or scores) computed
beside SDPA is the gradient of the eager attention's own weights, while the model's outputs
stay bitwise the kernel's and its parameter gradients what they are without clouseau; a
computed heads-last ``q`` has the kernel's query gradient, transposed; a gradient of a view
(the logit lens, ``head_out``) is refused, naming what to ask for."""

from __future__ import annotations

import pytest
import torch

import clouseau
from tests.canonical.families import BY_NAME, Family
from tests.canonical.test_interventions import _patched_softmax, eager_twin

#: The backward runs through the decomposition, not the fused kernel's own backward:
#: float32 rounding apart, the same gradient.
TOL = 1e-6


def _loss(logits: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(3)  # a fixed weighting: every logit's gradient differs
    return (logits * torch.randn(logits.shape)).sum()


def _eager_grad(family: Family, model: torch.nn.Module, layer: int, before: bool):
    """The gradient of the loss w.r.t. the eager twin's softmax output (the pattern) or,
    ``before``, its input (the scores), at block ``layer``."""
    eager = eager_twin(family, model)
    found: list[torch.Tensor] = []

    def tap(x: torch.Tensor) -> torch.Tensor:
        x.retain_grad()
        found.append(x)
        return x

    with _patched_softmax(layer, tap, before=before):
        _loss(eager(**family.inputs()).logits).backward()
    return found[0].grad


def _param_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("what", ["pattern", "scores"])
def test_the_gradient_of_a_computed_pattern_is_the_eager_attentions(family: str, what: str) -> None:
    fam = BY_NAME[family]
    model = fam.model("sdpa")
    plain = model(**fam.inputs()).logits
    _loss(plain).backward()
    plain_grads = _param_grads(model)
    for layer in (0, 1):
        name = f"blocks.{layer}.attn.{what}"
        want = _eager_grad(fam, model, layer, before=what == "scores")
        fmodel = clouseau.instrument(model, select=None, path=None, grads=name)
        for call in range(2):  # the first call (probed on copies) and a later one
            got = fmodel(**fam.inputs()).logits
            assert torch.equal(got, plain)  # forward: the fused kernel's, bit for bit
            _loss(got).backward()
            grads = _param_grads(model)
            assert grads.keys() == plain_grads.keys()
            for key, grad in grads.items():
                torch.testing.assert_close(grad, plain_grads[key], rtol=1e-5, atol=TOL)
            saved = torch.from_numpy(fmodel.captured.get(f"{name}.grad", call=call))
            keep = want.isfinite() & (want.abs() < 1e30)  # eager's masked scores: finfo.min
            torch.testing.assert_close(saved[keep], want[keep], rtol=0, atol=TOL)
            assert saved.abs().max() > 1e-3  # a real gradient, not zeros


def test_gradients_of_both_points_of_one_kernel_are_one_backward_pass() -> None:
    fam = BY_NAME["llama"]
    model = fam.model("sdpa")
    plain = model(**fam.inputs()).logits
    _loss(plain).backward()
    plain_grads = _param_grads(model)
    names = ["blocks.1.attn.pattern", "blocks.1.attn.scores"]
    fmodel = clouseau.instrument(model, select=None, path=None, grads=names)
    got = fmodel(**fam.inputs()).logits
    _loss(got).backward()
    for key, grad in _param_grads(model).items():  # not counted twice
        torch.testing.assert_close(grad, plain_grads[key], rtol=1e-5, atol=TOL)
    for name, before in zip(names, (False, True), strict=True):
        want = _eager_grad(fam, model, 1, before=before)
        saved = torch.from_numpy(fmodel.captured[f"{name}.grad"])
        keep = want.abs() < 1e30
        torch.testing.assert_close(saved[keep], want[keep], rtol=0, atol=TOL)


def test_the_gradient_of_an_intervened_pattern_is_the_eager_patchs() -> None:
    fam = BY_NAME["gpt2"]
    model = fam.model("sdpa")
    name = "blocks.1.attn.pattern"

    def halve_head_1(pattern: torch.Tensor) -> torch.Tensor:
        out = pattern.clone()
        out[:, 1] = out[:, 1] * 0.5
        return out

    eager = eager_twin(fam, model)
    found: list[torch.Tensor] = []

    def tap(x: torch.Tensor) -> torch.Tensor:
        x = halve_head_1(x)
        x.retain_grad()
        found.append(x)
        return x

    with _patched_softmax(1, tap, before=False):
        want_logits = eager(**fam.inputs()).logits
        _loss(want_logits).backward()
    fmodel = clouseau.instrument(
        model, select=None, path=None, grads=name,
        intervene={name: clouseau.replace(halve_head_1)},
    )  # fmt: skip
    got = fmodel(**fam.inputs()).logits
    torch.testing.assert_close(got, want_logits, rtol=0, atol=1e-5)
    _loss(got).backward()
    saved = torch.from_numpy(fmodel.captured[f"{name}.grad"])
    torch.testing.assert_close(saved, found[0].grad, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", ["blocks.0.logit_lens", "blocks.0.attn.head_out"])
def test_a_gradient_of_a_computed_view_is_refused(name: str) -> None:
    fam = BY_NAME["gpt2"]
    fmodel = clouseau.instrument(fam.model("sdpa"), select=None, path=None, grads=name)
    with pytest.raises(clouseau.SelectionError, match=r"in torch.*never reads.*resid_post"):
        fmodel(**fam.inputs())


def test_the_gradient_of_a_computed_heads_last_q_is_the_kernels_query_transposed() -> None:
    fam = BY_NAME["phi"]  # holds q only as [batch, head, pos, d_head]: computed heads-last
    model = fam.model("sdpa")
    plain = model(**fam.inputs()).logits
    real = torch.nn.functional.scaled_dot_product_attention
    queries: list[torch.Tensor] = []

    def sdpa(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        q.retain_grad()
        queries.append(q)
        return real(q, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        _loss(model(**fam.inputs()).logits).backward()
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    fmodel = clouseau.instrument(model, select=None, path=None, grads="blocks.0.attn.q")
    got = fmodel(**fam.inputs()).logits
    assert torch.equal(got, plain)
    _loss(got).backward()
    saved = torch.from_numpy(fmodel.captured["blocks.0.attn.q.grad"].copy())
    want = queries[0].grad.transpose(1, 2)  # block 0's query, [batch, pos, head, d_head]
    torch.testing.assert_close(saved, want, rtol=0, atol=0)
    assert saved.abs().max() > 0
