"""Every tensor inside a module's output is a point, on every tier (issue #28).

The zoo found module outputs whose elements had no point: ``nn.LSTM``'s ``(out, (h, c))``
(timm's sequencer), a ``ModelOutput`` whose ``hidden_states`` transformers collects with
its own forward hooks (data2vec-audio), a module returning its bias parameter
(gpt_neox_japanese), a module called ``output`` (git) that the graph's own output
node clashed with, a state each layer writes its slice of in place (RWKV) and a module
returning the model's own input (qwen2_audio's attention mask). Each model here reproduces one of them; every module output a forward
hook sees, named as docs/names.md says, must be a point holding the hook's value.
"""

from __future__ import annotations

import fnmatch
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import clouseau
from clouseau.ir.graph import TraceKind
from tests.models.helpers import OutputHooks, assert_equal, tensors_of

TIERS = {
    "fx": TraceKind.TORCH_FX,
    "export": TraceKind.TORCH_EXPORT,
    "dynamo": TraceKind.TORCH_DYNAMO,
    "hooks": TraceKind.TORCH_HOOKS,
}


def _branch(tier: str, y: torch.Tensor) -> torch.Tensor:
    """A branch torch.fx cannot trace (a shape: export takes it) or neither static tracer
    can (a value: the dynamic tier takes it); both sides compute the same value."""
    if tier == "export":
        return y * 2 if y.shape[0] > 0 else y
    if tier == "dynamo":
        return y * 2 if bool(y.sum() < 1e9) else y
    return y * 2


class Recurrent(nn.Module):
    """An LSTM read as ``y, _ = lstm(x)``, and one returned whole by its parent."""

    def __init__(self, tier: str) -> None:
        super().__init__()
        self.tier = tier
        self.rnn = nn.LSTM(6, 5, batch_first=True)
        self.fc = nn.Linear(5, 6)
        self.whole = Whole()

    def forward(self, x: torch.Tensor) -> Any:
        y, _ = self.rnn(x)
        y = _branch(self.tier, self.fc(y))
        out, (h, c) = self.whole(y)
        return out + h.transpose(0, 1) + c.transpose(0, 1)


class Whole(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 5, batch_first=True)

    def forward(self, x: torch.Tensor) -> Any:
        return self.lstm(x)


class Biased(nn.Module):
    """A module that returns its bias for its caller to add (gpt_neox_japanese's attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=False)
        self.bias = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fc(x), self.bias


class ReturnsBias(nn.Module):
    def __init__(self, tier: str) -> None:
        super().__init__()
        self.tier = tier
        self.attn = Biased()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, bias = self.attn(x)
        return _branch(self.tier, y + bias)


class Named(nn.Module):
    """Modules called ``output`` and ``input``, the names of the graph's own nodes (git)."""

    def __init__(self, tier: str) -> None:
        super().__init__()
        self.tier = tier
        self.input = nn.Linear(4, 4)
        self.output = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(_branch(self.tier, self.input(x)))


class Outer(nn.Module):
    """The model one level down: the hook path takes selections of dotted module paths."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.m = inner

    def forward(self, *args: torch.Tensor) -> Any:
        return self.m(*args)


class Mixer(nn.Module):
    """RWKV's time mixing: it writes its layer's slice of the shared state in place, through
    a view, and returns the state; the next layer writes its own slice afterwards."""

    def __init__(self, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, state: list[torch.Tensor]) -> Any:
        y = self.fc(x)
        state[0][:, :, self.layer] = y[:, -1]
        state[1][:, self.layer] += y.sum(1)
        return y, state


class Stateful(nn.Module):
    def __init__(self, tier: str) -> None:
        super().__init__()
        self.tier = tier
        self.mixers = nn.ModuleList(Mixer(i) for i in range(3))

    def forward(self, x: torch.Tensor) -> Any:
        state = [x.new_zeros(x.shape[0], 4, 3), x.new_zeros(x.shape[0], 3, 4)]
        for mixer in self.mixers:
            x, state = mixer(x, state)
        return _branch(self.tier, x), state


class Masked(nn.Module):
    """A module that returns the mask it was given, the model's own input (qwen2_audio)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * mask, mask


class PassesMask(nn.Module):
    def __init__(self, tier: str) -> None:
        super().__init__()
        self.tier = tier
        self.masked = Masked()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y, mask = self.masked(self.fc(x), mask)
        return _branch(self.tier, y) + mask


def _check(model: nn.Module, tier: str, *args: Any, select: Any = "*") -> Any:
    """Each module output a forward hook sees is a point equal to it, and the output equal
    eager's; the capture took ``tier`` (the hook path: ``select``'s modules in ``m``)."""
    if tier == "hooks":
        model = Outer(model)
        select = tuple(f"m.{path}{element}" for path in select for element in ("", ":*"))
    hooks = OutputHooks(model)
    try:
        with torch.no_grad():
            expected = model(*args)
    finally:
        hooks.remove()
    fmodel = clouseau.instrument(model, select=select, path=None)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dynamic tier says why it is taken
        actual = fmodel(*args)
    for a, e in zip(tensors_of(actual), tensors_of(expected), strict=True):
        assert_equal(a, e, "output")
    captured = fmodel.captured
    assert captured.graph.trace_kind is TIERS[tier]
    values = hooks.named(captured.graph)
    if select != "*":
        values = {k: v for k, v in values.items() if any(fnmatch.fnmatchcase(k, g) for g in select)}
    assert values
    missing = sorted(set(values) - set(captured.names()))
    assert not missing, f"module outputs that are not points: {missing}"
    for name, value in values.items():
        assert_equal(captured.get(name, call=0), value, name)
    fmodel.close()
    return values


@pytest.mark.parametrize("tier", list(TIERS))
def test_an_lstm_in_a_block_has_every_element_on_every_tier(tier: str) -> None:
    torch.manual_seed(0)
    model = Recurrent(tier if tier != "hooks" else "fx").eval()
    x = torch.randn(2, 3, 6)
    select = "*" if tier != "hooks" else ("rnn", "whole", "whole.lstm", "fc")
    values = _check(model, tier, x, select=select)
    names = {"rnn", "rnn:0", "rnn:1:0", "rnn:1:1", "whole", "whole:1:1", "whole.lstm:1:0"}
    prefix = "m." if tier == "hooks" else ""
    assert {prefix + n for n in names} <= set(values)


@pytest.mark.parametrize("tier", ["fx", "export", "hooks"])
def test_a_module_returning_its_parameter_has_it_as_a_point(tier: str) -> None:
    torch.manual_seed(0)
    model = ReturnsBias("fx" if tier == "hooks" else tier).eval()
    values = _check(model, tier, torch.randn(3, 4), select="*" if tier != "hooks" else ("attn",))
    name = "m.attn:1" if tier == "hooks" else "attn:1"
    np.testing.assert_array_equal(values[name].numpy(), model.attn.bias.detach().numpy())


@pytest.mark.parametrize("tier", ["fx", "export", "dynamo", "hooks"])
def test_modules_called_output_and_input_keep_their_names(tier: str) -> None:
    torch.manual_seed(0)
    model = Named("fx" if tier == "hooks" else tier).eval()
    select = "*" if tier != "hooks" else ("input", "output")
    names = {"input", "output"} if tier != "hooks" else {"m.input", "m.output"}
    assert names <= set(_check(model, tier, torch.randn(3, 4), select=select))


@pytest.mark.parametrize("tier", ["export", "dynamo", "hooks"])  # fx: no item assignment
def test_a_state_written_in_place_through_views_is_each_layers_own(tier: str) -> None:
    """Each mixer's returned state holds the slices written up to its return, not those
    the later layers write into the same tensors."""
    torch.manual_seed(0)
    model = Stateful("fx" if tier == "hooks" else tier).eval()
    select = "*" if tier != "hooks" else ("mixers.0", "mixers.1", "mixers.2")
    values = _check(model, tier, torch.randn(2, 5, 4), select=select)
    prefix = "m." if tier == "hooks" else ""
    first, last = values[f"{prefix}mixers.0:1:0"], values[f"{prefix}mixers.2:1:0"]
    assert bool((first[:, :, 1:] == 0).all()) and bool((last[:, :, 1:] != 0).any())


@pytest.mark.parametrize("tier", list(TIERS))
def test_a_module_returning_the_models_input_has_it_as_a_point(tier: str) -> None:
    torch.manual_seed(0)
    model = PassesMask("fx" if tier == "hooks" else tier).eval()
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    select = "*" if tier != "hooks" else ("masked",)
    values = _check(model, tier, torch.randn(3, 4), mask, select=select)
    name = "m.masked:1" if tier == "hooks" else "masked:1"
    np.testing.assert_array_equal(values[name].numpy(), mask.numpy())


def test_hidden_states_transformers_collects_with_its_own_hooks() -> None:
    """transformers collects ``hidden_states`` through forward hooks on its layers, installed
    by the first call that asks for them: they are the model's code and are traced, so the
    base model's ``hidden_states`` hold the layers' values on the export tier."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32,
        vocab_size=50, max_position_embeddings=32, output_hidden_states=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        model(ids)  # installs transformers' output-capturing hooks
    graph_kinds = {TraceKind.TORCH_FX, TraceKind.TORCH_EXPORT}
    values = _check_any(model, ids)
    assert values[0] in graph_kinds
    assert {"bert:hidden_states:0", "bert:hidden_states:2"} <= set(values[1])


def _check_any(model: nn.Module, *args: Any) -> tuple[TraceKind, dict[str, torch.Tensor]]:
    hooks = OutputHooks(model)
    try:
        with torch.no_grad():
            expected = model(*args)
    finally:
        hooks.remove()
    fmodel = clouseau.instrument(model, select="*", path=None)
    with torch.no_grad():
        actual = fmodel(*args)
    got, want = tensors_of(actual), tensors_of(expected)
    assert len(got) == len(want)
    for a, e in zip(got, want, strict=True):
        assert_equal(a, e, "output")
    captured = fmodel.captured
    values = hooks.named(captured.graph)
    missing = sorted(set(values) - set(captured.names()))
    assert not missing, f"module outputs that are not points: {missing}"
    for name, value in values.items():
        assert_equal(captured.get(name, call=0), value, name)
    kind = captured.graph.trace_kind
    fmodel.close()
    return kind, values
