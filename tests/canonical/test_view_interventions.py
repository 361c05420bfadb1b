"""Interventions on the derived views: ``blocks.*.attn.head_out`` changes what the model
reads (the output projection's output becomes the sum over heads of the intervened
head_out plus the bias), equal to the same ablation hand-patched into the eager model
with a pre-hook on the projection; ``blocks.*.logit_lens`` (read by nothing in the model)
changes its saved value only; a computed ``[batch, pos, head, d_head]`` layout of q, k, v
is transposed back into what the kernel reads; an intervention upstream reaches every
later view."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest
import torch

import clouseau
from clouseau.ir.computed import is_computed
from clouseau.ir.graph import TraceKind
from tests.canonical.families import BY_NAME, FAMILIES, Family, first_tensor
from tests.canonical.test_interventions import _Branchy, _patched_softmax, _uniform, eager_twin

#: A sum of per-head products rounds differently from the projection's one matmul.
TOL = 1e-5
HEADS = 4
LAYER = 1


def _projection(fam: str, model: torch.nn.Module, layer: int = LAYER) -> torch.nn.Module:
    """The attention output projection of block ``layer`` (what reads the merged heads)."""
    if fam == "gpt2":
        return model.transformer.h[layer].attn.c_proj
    return model.model.layers[layer].self_attn.o_proj


def _head_patched(
    fam: Family, model: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]
) -> torch.utils.hooks.RemovableHandle:
    """A pre-hook on block LAYER's projection applying ``fn`` to its input split into heads
    (``[..., head, d_head]``): the eager ablation a head_out intervention stands for."""

    def pre(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        heads = x.reshape(*x.shape[:-1], HEADS, x.shape[-1] // HEADS)
        return (fn(heads).reshape(x.shape), *args[1:])

    return _projection(fam.name, model).register_forward_pre_hook(pre)


def _zero_head(h: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:  # [batch, pos, head, ...]
        out = x.clone()
        out[:, :, h] = 0.0
        return out

    return fn


def _scale_head(h: int, k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        out[:, :, h] *= k
        return out

    return fn


def _halve(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


CASES = {
    "zero-head": (clouseau.replace(_zero_head(1)), _zero_head(1)),
    "scale-head": (clouseau.replace(_scale_head(2, 3.0)), _scale_head(2, 3.0)),
    "scale": (clouseau.scale(0.5), _halve),
}


def _eager(fam: Family, model: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]):
    handle = _head_patched(fam, model, fn)
    try:
        with torch.no_grad():
            return model(**fam.inputs()).logits
    finally:
        handle.remove()


def _plain_head_out(fam: Family, model: torch.nn.Module) -> torch.Tensor:
    name = f"blocks.{LAYER}.attn.head_out"
    fmodel = clouseau.instrument(model, select=name, path=None)
    with torch.no_grad():
        fmodel(**fam.inputs())
    return torch.from_numpy(fmodel.captured[name].copy())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("case", list(CASES))
def test_an_intervention_on_head_out_is_the_eager_head_ablation(family: str, case: str) -> None:
    fam = BY_NAME[family]
    model = fam.model()
    action, fn = CASES[case]
    want = _eager(fam, model, fn)
    with torch.no_grad():
        plain = model(**fam.inputs()).logits
    before = _plain_head_out(fam, model)
    name = f"blocks.{LAYER}.attn.head_out"
    fmodel = clouseau.instrument(model, select=name, path=None, intervene={name: action})
    for call in range(2):  # the first call (probed on copies) and a later one
        with torch.no_grad():
            got = fmodel(**fam.inputs()).logits
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
        assert (got - plain).abs().max() > 10 * TOL  # the intervention reached the outputs
        # The saved head_out is the intervened one.
        seen = torch.from_numpy(fmodel.captured.get(name, call=call).copy())
        torch.testing.assert_close(seen, fn(before), rtol=0, atol=1e-6)
    assert {g.trace_kind for g in fmodel.captured.graphs} <= {
        TraceKind.TORCH_FX,
        TraceKind.TORCH_EXPORT,
    }


@pytest.mark.parametrize("fam", [f for f in FAMILIES if f.logits], ids=lambda f: f.name)
def test_an_identity_intervention_on_every_head_out_keeps_the_outputs(fam: Family) -> None:
    # Every family's projection (Conv1D's addmm, Linear, a fused query-key-value's dense),
    # through the sum over heads plus the bias: to rounding, not bitwise.
    model = fam.model()
    with torch.no_grad():
        plain = first_tensor(model(**fam.inputs()))
    fmodel = clouseau.instrument(
        model, select="logits", path=None, intervene={"head_out": clouseau.scale(1.0)}
    )
    with torch.no_grad():
        got = first_tensor(fmodel(**fam.inputs()))
    torch.testing.assert_close(got, plain, rtol=0, atol=TOL)
    assert fmodel.captured.graph.interventions  # every head_out found, none refused


def test_a_head_out_intervention_in_the_dynamic_tier_is_the_eager_ablation() -> None:
    from clouseau.capture.torch.runtime.tiers import Tier

    fam = BY_NAME["gpt2"]
    model = fam.model()
    ids = fam.inputs()["input_ids"]
    handle = _head_patched(fam, model, _zero_head(1))
    with torch.no_grad():
        want = _Branchy(model)(ids)
    handle.remove()
    with torch.no_grad():
        plain = _Branchy(model)(ids)
    before = _plain_head_out(fam, model)
    name = f"blocks.{LAYER}.attn.head_out"
    fmodel = clouseau.instrument(
        _Branchy(model), select=name, path=None,
        intervene={name: clouseau.replace(_zero_head(1))},
    )  # fmt: skip
    tier = Tier.DYNAMO.value.replace("(", r"\(").replace(")", r"\)")
    for call in range(2):
        warns = pytest.warns(UserWarning, match=tier) if call == 0 else nullcontext()
        with torch.no_grad(), warns:
            got = fmodel(ids)
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
        assert (got - plain).abs().max() > 10 * TOL
        seen = torch.from_numpy(fmodel.captured.get(name, call=call).copy())
        torch.testing.assert_close(seen, _zero_head(1)(before), rtol=0, atol=1e-6)
    assert {g.trace_kind for g in fmodel.captured.graphs} == {TraceKind.TORCH_DYNAMO}


def test_a_head_out_intervention_applies_at_every_generation_step() -> None:
    fam = BY_NAME["llama"]
    model = fam.model()
    ids = fam.inputs()["input_ids"]
    kw = {"max_new_tokens": 3, "do_sample": False}
    handle = _head_patched(fam, model, _zero_head(1))
    with torch.no_grad():
        want = model.generate(ids, **kw, output_logits=True, return_dict_in_generate=True)
    handle.remove()
    name = f"blocks.{LAYER}.attn.head_out"
    fmodel = clouseau.instrument(
        model, select=["logits", name], path=None,
        intervene={name: clouseau.replace(_zero_head(1))},
    )  # fmt: skip
    with torch.no_grad():
        got = fmodel.generate(ids, **kw)
    assert torch.equal(got, want.sequences)
    cap = fmodel.captured
    assert len(cap.calls) == len(want.logits) == 3
    for step, logits in zip(cap.calls, want.logits, strict=True):
        last = torch.from_numpy(cap.get("logits", call=step).copy())[:, -1]
        torch.testing.assert_close(last, logits, rtol=0, atol=TOL)
        assert not cap.get(name, call=step)[:, :, 1].any()  # the saved head is zeroed


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_an_intervention_on_logit_lens_changes_its_saved_value_only(family: str) -> None:
    fam = BY_NAME[family]
    model = fam.model()
    plain = clouseau.instrument(model, select="blocks.0.logit_lens", path=None)
    with torch.no_grad():
        want = model(**fam.inputs()).logits
        plain(**fam.inputs())
    lens = torch.from_numpy(plain.captured["blocks.0.logit_lens"].copy())
    fmodel = clouseau.instrument(
        model, select=["blocks.0.logit_lens", "logits"], path=None,
        intervene={"blocks.0.logit_lens": clouseau.replace(lambda x: x.softmax(-1))},
    )  # fmt: skip
    for call in range(2):
        with torch.no_grad():
            got = fmodel(**fam.inputs()).logits
        assert torch.equal(got, want)  # nothing in the model reads the logit lens
        seen = torch.from_numpy(fmodel.captured.get("blocks.0.logit_lens", call=call).copy())
        torch.testing.assert_close(seen, lens.softmax(-1), rtol=0, atol=1e-6)
        assert torch.equal(torch.from_numpy(fmodel.captured.get("logits", call=call).copy()), want)


def _by_head(fam: str, model: torch.nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Head ``h``'s share of the projection's output, by hand: ``z_h @ W_h`` (no bias)."""
    proj = _projection(fam, model)
    heads = z.reshape(*z.shape[:-1], HEADS, z.shape[-1] // HEADS)
    d = heads.shape[-1]
    # Conv1D holds weight as [in, out]; Linear as [out, in].
    w = proj.weight if fam == "gpt2" else proj.weight.T
    return torch.stack([heads[..., h, :] @ w[h * d : (h + 1) * d] for h in range(HEADS)], dim=-2)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_an_upstream_intervention_reaches_every_later_view(family: str) -> None:
    fam = BY_NAME[family]
    model = fam.model()
    blocks = model.transformer.h if family == "gpt2" else model.model.layers
    final = (model.transformer.ln_f if family == "gpt2" else model.model.norm, model.lm_head)
    seen: dict[str, torch.Tensor] = {}

    def halve(module: Any, args: Any, out: Any) -> Any:
        if isinstance(out, tuple):
            seen["resid"] = out[0] * 0.5
            return (seen["resid"], *out[1:])
        seen["resid"] = out * 0.5
        return seen["resid"]

    def z_in(module: Any, args: tuple[Any, ...]) -> None:
        seen["z"] = args[0].detach().clone()

    handles = [
        blocks[0].register_forward_hook(halve),
        _projection(family, model).register_forward_pre_hook(z_in),
    ]
    with torch.no_grad():
        want = model(**fam.inputs()).logits
        lens0 = final[1](final[0](seen["resid"]))
    for handle in handles:
        handle.remove()
    names = ["blocks.0.logit_lens", "blocks.1.logit_lens", "blocks.1.attn.head_out"]
    fmodel = clouseau.instrument(
        model, select=names, path=None, intervene={"blocks.0.resid_post": clouseau.scale(0.5)}
    )
    with torch.no_grad():
        got = fmodel(**fam.inputs()).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    cap = fmodel.captured
    torch.testing.assert_close(torch.from_numpy(cap[names[0]].copy()), lens0, rtol=0, atol=1e-5)
    # At the last block the logit lens is the (intervened) model's logits.
    torch.testing.assert_close(torch.from_numpy(cap[names[1]].copy()), want, rtol=0, atol=1e-5)
    hand = _by_head(family, model, seen["z"])
    torch.testing.assert_close(torch.from_numpy(cap[names[2]].copy()), hand, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_head_out_and_pattern_of_one_layer_compose(family: str) -> None:
    # The pattern's intervention replaces the kernel by its decomposition; the head_out
    # read from its output is then intervened on and recomposed into the projection.
    fam = BY_NAME[family]
    model = fam.model("sdpa")
    eager = eager_twin(fam, model)
    handle = _head_patched(fam, eager, _zero_head(2))
    with torch.no_grad(), _patched_softmax(LAYER, _uniform, before=False):
        want = eager(**fam.inputs()).logits
    handle.remove()
    fmodel = clouseau.instrument(
        model, select="logits", path=None,
        intervene={f"blocks.{LAYER}.attn.pattern": clouseau.replace(_uniform),
                   f"blocks.{LAYER}.attn.head_out": clouseau.replace(_zero_head(2))},
    )  # fmt: skip
    for _ in range(2):
        with torch.no_grad():
            got = fmodel(**fam.inputs()).logits
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)


def test_head_out_and_the_projection_it_stands_in_for_are_refused_together() -> None:
    # Llama's attn_out is o_proj's output, the value head_out is recomposed into: an
    # intervention on both would lose one of them.
    fam = BY_NAME["llama"]
    fmodel = clouseau.instrument(
        fam.model(), select="logits", path=None,
        intervene={"blocks.1.attn.head_out": clouseau.replace(_zero_head(1)),
                   "blocks.1.attn_out": clouseau.scale(2.0)},
    )  # fmt: skip
    with pytest.raises(
        clouseau.SelectionError, match=r"both 'blocks.1.attn.head_out' and .*replace\(fn\)"
    ):
        fmodel(**fam.inputs())


@contextmanager
def _patched_sdpa(layer: int, which: int, fn: Callable[[torch.Tensor], torch.Tensor]):
    """``F.scaled_dot_product_attention`` of block ``layer`` (its ``layer``-th call of each
    forward of two blocks) with ``fn`` applied to its input ``which`` (0: query, 1: key,
    2: value) in the ``[batch, pos, head, d_head]`` layout."""
    real = torch.nn.functional.scaled_dot_product_attention
    calls = iter(range(1 << 30))

    def sdpa(*args: Any, **kwargs: Any) -> torch.Tensor:
        if next(calls) % 2 == layer:
            args = list(args)
            args[which] = fn(args[which].transpose(1, 2)).transpose(1, 2)
        return real(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = real


@pytest.mark.parametrize(
    ("family", "leaf"), [("gpt_neox", "q"), ("gpt_neox", "v"), ("phi", "k"), ("falcon", "q")]
)
def test_an_intervention_on_a_computed_head_layout_is_the_eager_patch(
    family: str, leaf: str
) -> None:
    # These families hold q, k, v only as [batch, head, pos, d_head]: the canonical
    # [batch, pos, head, d_head] one is computed, and an intervention on it is transposed
    # back into the value the kernel reads.
    fam = BY_NAME[family]
    model = fam.model("sdpa")
    name = f"blocks.0.attn.{leaf}"
    fn = _zero_head(1)
    with torch.no_grad():
        plain = first_tensor(model(**fam.inputs()))
        with _patched_sdpa(0, "qkv".index(leaf), fn):
            want = first_tensor(model(**fam.inputs()))
    fmodel = clouseau.instrument(
        model, select=name, path=None, intervene={name: clouseau.replace(fn)}
    )
    graph = clouseau.trace(model, **fam.inputs())
    assert is_computed(graph.node(graph.point(name).ref.node))
    for call in range(2):
        with torch.no_grad():
            got = first_tensor(fmodel(**fam.inputs()))
        torch.testing.assert_close(got, want, rtol=0, atol=TOL)
        assert (got - plain).abs().max() > 10 * TOL
        assert not fmodel.captured.get(name, call=call)[:, :, 1].any()
