"""Interventions and gradient capture on PyTorch models, against hand-modified models."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import clouseau  # noqa: E402
from clouseau.capture.torch import to_numpy  # noqa: E402

from ..torch.models import CNN, MLP, EncoderBlock  # noqa: E402


class Fn(nn.Module):
    """A module applying ``fn``: how a hand-modified model changes a value."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _modified(model: MLP, fn: Callable[[torch.Tensor], torch.Tensor]) -> MLP:
    """The MLP with its ReLU followed by ``fn`` (same weights)."""
    hand = copy.deepcopy(model)
    hand.act = nn.Sequential(nn.ReLU(), Fn(fn))
    return hand


@pytest.fixture
def mlp() -> MLP:
    torch.manual_seed(0)
    return MLP().eval()


@pytest.mark.parametrize(
    ("action", "fn"),
    [
        (clouseau.zero(), torch.zeros_like),
        (clouseau.scale(0.25), lambda v: v * 0.25),
        (clouseau.clamp(0.1, 0.3), lambda v: torch.clamp(v, 0.1, 0.3)),
        (clouseau.replace(torch.tanh), torch.tanh),
        (clouseau.add(0.5), lambda v: v + 0.5),
        (clouseau.mean_ablate(), lambda v: v.mean(0, keepdim=True).expand_as(v)),
    ],
    ids=["zero", "scale", "clamp", "replace", "add", "mean_ablate"],
)
def test_action_on_every_relu_equals_the_hand_modified_model(mlp, action, fn):
    x = torch.randn(5, 8)
    fmodel = clouseau.instrument(mlp, select=["act", "fc2"], path=None, intervene={"relu*": action})
    with torch.no_grad():
        y = fmodel(x)
        hand = _modified(mlp, fn)
        expected = hand(x)
        changed = hand.act(mlp.fc1(x))
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    cap = fmodel.captured
    np.testing.assert_array_equal(cap["act"], to_numpy(changed))  # saved after the change
    np.testing.assert_array_equal(cap["fc2"], to_numpy(expected))
    assert f"intervene[{action.describe()}](%act)" in str(fmodel.trace(x))


def test_add_a_tensor_and_noise_are_reproducible(mlp):
    x = torch.randn(3, 8)
    steer = torch.linspace(-1, 1, 16)
    fmodel = clouseau.instrument(
        mlp, select=None, path=None, intervene={"fc1": clouseau.add(steer)}
    )
    with torch.no_grad():
        torch.testing.assert_close(fmodel(x), mlp.fc2(mlp.act(mlp.fc1(x) + steer)), rtol=0, atol=0)
    noisy = clouseau.instrument(
        mlp, select=None, path=None, intervene={"act": clouseau.noise(0.5, seed=1)}
    )
    with torch.no_grad():
        first, second, clean = noisy(x), noisy(x), mlp(x)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    assert not torch.equal(first, clean)


def test_patch_from_a_capture_of_input_a_into_a_run_on_input_b(mlp):
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    with clouseau.instrument(mlp, select="act", path=None) as recorder, torch.no_grad():
        recorder(a)
    source = recorder.captured
    fmodel = clouseau.instrument(
        mlp, select=None, path=None, intervene={"act": clouseau.patch(source)}
    )
    with torch.no_grad():
        patched = fmodel(b)
        expected = mlp.fc2(mlp.act(mlp.fc1(a)))  # everything after act sees input A's value
    torch.testing.assert_close(patched, expected, rtol=0, atol=0)
    # By another name, and with autograd on: the patched value is a constant.
    renamed = clouseau.instrument(
        mlp,
        select=None,
        path=None,
        intervene={"fc1": clouseau.patch({"h": to_numpy(mlp.fc1(a).detach())}, name="h")},
    )
    b.requires_grad_(True)
    out = renamed(b)
    torch.testing.assert_close(out, expected.detach(), rtol=0, atol=0)
    out.sum().backward()
    assert b.grad is None or torch.count_nonzero(b.grad) == 0


def test_interventions_are_differentiable_like_the_hand_modified_model(mlp):
    x = torch.randn(6, 8)
    fmodel = clouseau.instrument(
        mlp, select=None, path=None, intervene={"act": clouseau.scale(3.0)}
    )
    fmodel(x).square().sum().backward()
    got = {n: p.grad.clone() for n, p in mlp.named_parameters()}
    hand = _modified(mlp, lambda v: v * 3.0)
    hand(x).square().sum().backward()
    for name, param in hand.named_parameters():
        key = name.replace("act.0.", "act.")
        torch.testing.assert_close(got[key], param.grad)


def test_intervening_before_an_inplace_op():
    torch.manual_seed(0)
    model = CNN().eval()
    x = torch.randn(2, 3, 8, 8)
    fmodel = clouseau.instrument(
        model, select=["bn", "relu"], path=None, intervene={"bn": clouseau.scale(-1.0)}
    )
    with torch.no_grad():
        y = fmodel(x)
        bn = -model.bn(model.conv(x))
        expected = model.head(torch.flatten(model.pool(torch.relu(bn)), 1))
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    cap = fmodel.captured
    np.testing.assert_array_equal(cap["bn"], to_numpy(bn))  # a snapshot before ReLU(inplace)
    np.testing.assert_array_equal(cap["relu"], to_numpy(torch.relu(bn)))


def test_nothing_to_intervene_compiles_to_the_uninstrumented_graph(mlp):
    x = torch.randn(2, 8)
    plain = clouseau.instrument(mlp, select="act", path=None)
    empty = clouseau.instrument(mlp, select="act", path=None, intervene={}, grads=False)
    assert str(plain.trace(x)) == str(empty.trace(x))
    assert plain.lowered(x).module.code == empty.lowered(x).module.code
    bare = clouseau.instrument(mlp, select=None, path=None, intervene={})
    assert (
        bare.lowered(x).module.code
        == clouseau.instrument(mlp, select=None, path=None).lowered(x).module.code
    )


# --- gradients ---------------------------------------------------------------------------


def _retained(model: nn.Module, *paths: str) -> dict[str, torch.Tensor]:
    """Forward hooks that retain_grad() the outputs of the modules at ``paths``."""
    kept: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())

    def hook(path: str):
        def keep(module: nn.Module, args: tuple, out: object) -> None:
            value = out[0] if isinstance(out, tuple) else out
            value.retain_grad()
            kept[path] = value

        return keep

    for path in paths:
        modules[path].register_forward_hook(hook(path))
    return kept


def test_saved_gradients_equal_retain_grad_on_an_mlp(mlp):
    x = torch.randn(5, 8, requires_grad=True)
    fmodel = clouseau.instrument(mlp, select="*", path=None, grads=True)
    for _ in range(2):  # two calls: each call keeps its own gradients
        fmodel(x).square().sum().backward()
    hand = copy.deepcopy(mlp)
    kept = _retained(hand, "fc1", "act", "fc2")
    x_ref = x.detach().clone().requires_grad_(True)
    hand(x_ref).square().sum().backward()
    cap = fmodel.captured
    for name in ("fc1", "act", "fc2"):
        for call in (0, 1):
            np.testing.assert_allclose(
                cap.get(f"{name}.grad", call=call), to_numpy(kept[name].grad), rtol=1e-6
            )
    np.testing.assert_allclose(cap.get("x.grad", call=1), to_numpy(x_ref.grad), rtol=1e-6)
    assert cap.get("fc1", call=1).shape == cap.get("fc1.grad", call=1).shape


def test_saved_gradients_equal_retain_grad_on_a_transformer_block():
    torch.manual_seed(0)
    block = EncoderBlock().eval()
    x = torch.randn(2, 5, 16)
    fmodel = clouseau.instrument(
        block, select=None, path=None, grads=["ln1", "ln2", "mlp.*", "getitem", "add"]
    )
    fmodel(x).pow(3).mean().backward()
    hand = copy.deepcopy(block)
    kept = _retained(hand, "ln1", "ln2", "mlp.0", "mlp.1", "mlp.2", "attn")
    before_ln2: dict[str, torch.Tensor] = {}

    def keep_input(module: nn.Module, args: tuple) -> None:
        args[0].retain_grad()
        before_ln2["add"] = args[0]

    hand.ln2.register_forward_pre_hook(keep_input)
    hand(x).pow(3).mean().backward()
    cap = fmodel.captured
    for name, ref in {**kept, **before_ln2}.items():
        point = "getitem" if name == "attn" else name
        np.testing.assert_allclose(cap[f"{point}.grad"], to_numpy(ref.grad), rtol=1e-5, atol=1e-7)


def test_gradient_of_a_value_changed_in_place_later_is_of_the_value_itself():
    torch.manual_seed(0)
    model = CNN().eval()
    x = torch.randn(2, 3, 8, 8)
    fmodel = clouseau.instrument(model, select=None, path=None, grads="bn")
    fmodel(x).sum().backward()
    hand = copy.deepcopy(model)
    hand.relu = nn.ReLU()  # not in place, so retain_grad sees the BatchNorm output
    kept = _retained(hand, "bn")
    hand(x).sum().backward()
    np.testing.assert_allclose(fmodel.captured["bn.grad"], to_numpy(kept["bn"].grad), rtol=1e-6)


def test_no_gradient_is_saved_without_backward_or_under_no_grad(mlp):
    fmodel = clouseau.instrument(mlp, select="act", path=None, grads=True)
    with torch.no_grad():
        fmodel(torch.randn(2, 8))
    fmodel(torch.randn(2, 8))
    assert fmodel.captured.names() == ("act",)


def test_intervening_on_an_input_and_gradients_on_disk(mlp, tmp_path):
    x = torch.randn(3, 8)
    fmodel = clouseau.instrument(
        mlp, select="fc1", path=tmp_path, intervene={"x": clouseau.scale(2.0)}, grads=True
    )
    with fmodel:
        y = fmodel(x)
        y.sum().backward()
    torch.testing.assert_close(y, mlp(2.0 * x), rtol=0, atol=0)
    cap = clouseau.load(tmp_path)
    hand = copy.deepcopy(mlp)
    kept = _retained(hand, "fc1")
    hand(2.0 * x).sum().backward()
    np.testing.assert_allclose(cap["fc1.grad"], to_numpy(kept["fc1"].grad), rtol=1e-6)
    assert {r.call for r in cap.records} == {0}
