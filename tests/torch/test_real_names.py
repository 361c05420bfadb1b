"""Names on awkward models: module paths that look like op counters, odd keys, reuse."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import clouseau
from clouseau.capture import torch as ct
from clouseau.capture.torch.naming.points import clean_paths
from clouseau.ir.graph import TraceKind
from tests.models.helpers import OutputHooks, check_model


class Inner(nn.Module):
    """Children named like the op counters of their parent's ops."""

    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.relu_1 = nn.ReLU()
        self.add = nn.Identity()
        self.ln_1 = nn.LayerNorm(4)
        self.ln_2 = nn.LayerNorm(4)
        self.x_1 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.relu(self.ln_1(x))
        b = self.relu_1(self.ln_2(x))
        c = self.add(torch.relu(a) + b)
        c = self.relu(c)  # the module's second call
        return self.x_1(c) + F.relu(c)


class Torture(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.add = Inner()
        self.add_1 = Inner()
        self.layers = nn.ModuleDict(
            {"layer 1": nn.Linear(4, 4), "layer_1": nn.Linear(4, 4), "ünï#%,:*": nn.Linear(4, 4)}
        )

    def forward(self, x_1: torch.Tensor) -> torch.Tensor:
        y = self.add(x_1)
        y = self.add(y)  # a reused non-leaf module
        y = self.add_1(y) + y  # a root op named like a module
        for key in self.layers:
            y = self.layers[key](y)
        return self.relu(y) + torch.relu(y)


def _inner(p: str, second: bool = False) -> list[str]:
    # Module calls are named first: relu's second call is relu_2 (relu_1 is a module),
    # its third relu_3, ...; then the ops take the first counters no call owns (the
    # functional relu, the `+`). torchvision's own names (`ln` for ln_1) are aliases.
    if not second:
        return [
            f"{p}.ln_1", f"{p}.ln", f"{p}.relu", f"{p}.ln_2", f"{p}.relu_1", f"{p}.relu_5",
            f"{p}.add_2", f"{p}.add", f"{p}.relu_2", f"{p}.x_1", f"{p}.x", f"{p}.relu_6",
            f"{p}.add_3",
        ]  # fmt: skip
    return [
        f"{p}.ln_1_1", f"{p}.relu_3", f"{p}.ln_2_1", f"{p}.ln_3", f"{p}.relu_1_1",
        f"{p}.relu_7", f"{p}.add_4", f"{p}.add_1", f"{p}.relu_4", f"{p}.x_1_1", f"{p}.relu_8",
        f"{p}.relu_9", f"{p}.add_5",
    ]  # fmt: skip


GOLDEN = (
    "x_1",
    *_inner("add"), "add",
    *_inner("add", second=True), "add_2",  # add_1 is a module: the next free counter
    # called once: fewer module calls, so the ops' counters are lower
    "add_1.ln_1", "add_1.ln", "add_1.relu", "add_1.ln_2", "add_1.relu_1", "add_1.relu_3",
    "add_1.add_1", "add_1.add", "add_1.relu_2", "add_1.x_1", "add_1.x", "add_1.relu_4",
    "add_1.add_2", "add_1",
    "add_3",  # the root's `+`: add, add_1, add_2 are taken
    # "layer 1" -> layer_1_1 (the real layer_1 keeps its name); torchvision: layer_2
    "layers.layer_1_1", "layers.layer_1", "layers.layer_2", "layers._n______",
    "relu", "relu_1", "add_4",
)  # fmt: skip


def test_golden_names_of_a_naming_torture_model() -> None:
    g = ct.trace(Torture().eval(), torch.randn(2, 4))
    assert g.trace_kind is TraceKind.TORCH_FX
    assert g.names() == GOLDEN
    assert g.point("layers.layer_1_1").ref.node == "layers.layer_1_1"
    assert g.node("layers.layer_1_1").target.endswith("Linear")
    # Each module path names that module's output, whatever torchvision calls it.
    assert g.point("add.ln_1").ref == g.point("add.ln").ref
    assert g.point("add.ln_2").ref.node == "add.ln_2"
    calls = [name for path, name in g.meta_value("module_calls") if path == "add"]
    assert calls == ["add", "add_2"]


def test_torture_model_values_equal_forward_hooks() -> None:
    check_model(Torture().eval(), torch.randn(2, 4))


class ShapeBranchTorture(Torture):
    """fx cannot follow a branch on a shape: the export path."""

    def forward(self, x_1: torch.Tensor) -> torch.Tensor:
        if x_1.shape[0] > 1:
            return super().forward(x_1)
        return super().forward(x_1 * 2)


def test_torture_model_values_equal_forward_hooks_on_the_export_path() -> None:
    graph = check_model(ShapeBranchTorture().eval(), torch.randn(2, 4))
    assert graph.trace_kind is TraceKind.TORCH_EXPORT
    module_names = {name for _, name in graph.meta_value("module_calls")}
    fx_names = {
        name for _, name in ct.trace(Torture().eval(), torch.randn(2, 4)).meta_value("module_calls")
    }
    assert module_names == fx_names


def test_module_dict_with_odd_keys_is_sanitised_deterministically() -> None:
    paths = clean_paths(["layers", "layers.layer 1", "layers.layer_1", "layers.a#b", "layers.é"])
    assert paths == {
        "": "", "layers": "layers", "layers.layer 1": "layers.layer_1_1",
        "layers.layer_1": "layers.layer_1", "layers.a#b": "layers.a_b", "layers.é": "layers._",
    }  # fmt: skip
    model = Torture().eval()
    fmodel = clouseau.instrument(model, select=None, path=None)
    assert torch.equal(fmodel(torch.ones(2, 4)), model(torch.ones(2, 4)))
    g = fmodel.trace(torch.ones(2, 4))
    assert {"layers.layer_1", "layers.layer_1_1", "layers._n______"} <= set(g.names())
    assert g.point("layers.layer_1").module == "layers.layer_1"


@pytest.mark.parametrize(
    "region",
    [
        lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        torch.no_grad,
        torch.inference_mode,
        torch.enable_grad,
    ],
    ids=["autocast", "no_grad", "inference_mode", "enable_grad"],
)
def test_regions_that_change_numerics_keep_values_and_dtypes(region) -> None:  # type: ignore[no-untyped-def]
    class Regions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with region():
                y = self.a(x)
            return y, self.b(x.float()) * 2

    model = Regions().eval()
    x = torch.randn(3, 4)
    # enable_grad changes something only where grad is off
    outer = torch.no_grad if region is torch.enable_grad else contextlib.nullcontext
    with outer():
        expected = model(x)
        fmodel = clouseau.instrument(model, select="*", path=None)
        actual = fmodel(x)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and torch.equal(a, e)
        assert a.requires_grad == e.requires_grad
        assert a.is_inference() == e.is_inference()
    # export records no inference_mode region: a module called inside one takes the dynamic tier
    dynamic = region is torch.inference_mode
    kind = TraceKind.TORCH_DYNAMO if dynamic else TraceKind.TORCH_EXPORT
    assert fmodel.captured.graph.trace_kind is kind
    if dynamic:  # the dynamic tier names module calls by path; compare with forward hooks
        hooks = OutputHooks(model)
        try:
            model(x)
        finally:
            hooks.remove()
        for path, calls in hooks.calls.items():
            np.testing.assert_array_equal(fmodel.captured[path], calls[0][""].numpy(), path)
        return
    assert "autocast, grad or inference mode" in fmodel.captured.graph.meta_value("fx_error")
    with outer():
        check_model(model, x)


class Counting(nn.Module):
    """A module with a Python side effect, traced as a leaf (run, not traced)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2


class WithSideEffects(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.count = Counting()
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.count(self.bn(self.fc(x))))


def test_the_first_call_runs_nothing_twice() -> None:
    model, reference = WithSideEffects(), WithSideEffects()
    reference.load_state_dict(model.state_dict())
    ct.mark_leaf(model.count, reference.count)
    hooked: list[int] = []
    model.fc.register_forward_hook(lambda *_: hooked.append(1))
    x = torch.randn(3, 4)
    torch.manual_seed(1)
    expected = [reference(x), reference(x)]  # training: dropout and BatchNorm statistics
    rng_after = torch.rand(1)
    fmodel = clouseau.instrument(model, select="*", path=None)
    torch.manual_seed(1)
    actual = [fmodel(x), fmodel(x)]
    assert torch.equal(torch.rand(1), rng_after)  # the RNG advanced as in two eager calls
    assert len(hooked) == 2 and model.count.calls == 2  # once per call
    assert torch.equal(model.bn.running_mean, reference.bn.running_mean)
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)
    captured = fmodel.captured
    assert captured.calls == (0, 1)
    for call, want in enumerate(expected):
        assert torch.equal(torch.from_numpy(captured.get("drop", call=call)), want)


def test_a_module_returning_no_tensor_is_listed_in_one_warning() -> None:
    class Config(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, int]:
            return {"width": 4}

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = Config()
            self.other = Config()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * self.config(x)["width"] + self.other(x)["width"]

    with pytest.warns(
        UserWarning, match=r"2 module output\(s\).*config \(dict\), other \(dict\)"
    ) as seen:
        fmodel = clouseau.instrument(Model(), select="*", path=None)
        fmodel(torch.randn(2, 4))
    assert len([w for w in seen if "module output" in str(w.message)]) == 1


def test_an_unflattenable_output_type_is_named_in_the_fix() -> None:
    class Box:
        def __init__(self, value: torch.Tensor) -> None:
            self.value = value

    class Boxed(nn.Module):
        def forward(self, x: torch.Tensor, **options: object) -> Box:
            return Box(x + 1)

    with pytest.raises(clouseau.TraceError, match=r"Fix: the model takes or returns a .*Box"):
        clouseau.trace(Boxed(), torch.randn(2))


class InPlaceReturn(nn.Module):
    """torchvision MViT's PositionalEncoding: ``x.add_(pos)`` then ``return x``."""

    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.randn(4))
        self.pos = nn.Parameter(torch.randn(7, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat((self.cls.expand(x.size(0), -1).unsqueeze(1), x), dim=1)
        x.add_(self.pos)
        x.mul_(2.0)
        return x


def test_a_module_output_mutated_in_place_before_return_is_the_returned_value() -> None:
    # fx's graph returns the cat node (its value before add_): the output is the last mutation
    model = nn.Sequential(InPlaceReturn(), nn.Linear(4, 4)).eval()
    check_model(model, torch.randn(2, 6, 4))
