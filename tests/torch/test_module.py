"""The instrumented module: selection, modes, autograd, caching, state, errors."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture import torch as ct
from clouseau.ir.errors import SelectionError, TraceError
from clouseau.ir.graph import Graph, Point
from clouseau.ir.passes import insert_saves
from clouseau.ir.selection import Selector
from clouseau.ir.verify import verify
from tests.conftest import RecordingSink
from tests.torch import models
from tests.torch.conftest import assert_same


@functools.cache
def resnet_graph() -> Graph:
    return ct.trace(models.ResNet().eval(), torch.randn(1, 3, 16, 16))


def resnet_selected(select) -> set[str]:  # type: ignore[no-untyped-def]
    # instrument() runs exactly this pass on the traced graph (test_select_through_instrument)
    graph = verify(insert_saves(resnet_graph(), select))
    return {name for save in graph.saves for name in save.attr("names")}  # type: ignore[union-attr]


def test_select_through_instrument(sink: RecordingSink) -> None:
    fm = ct.instrument(models.ResNet().eval(), select="layer2.*.relu*", sink=sink)
    graph = fm.trace(torch.randn(1, 3, 16, 16))
    expected = {f"{b}.{r}" for b in ("layer2.0", "layer2.1") for r in ("relu", "relu_1")}
    assert {n for s in graph.saves for n in s.attr("names")} == expected  # type: ignore[union-attr]
    fm(torch.randn(1, 3, 16, 16))
    assert set(sink.values()) == expected


BLOCKS = ("layer1.0", "layer1.1", "layer2.0", "layer2.1")


def test_select_relu_glob() -> None:
    expected = {"relu"} | {f"{b}.{r}" for b in BLOCKS for r in ("relu", "relu_1")}
    assert resnet_selected("relu*") == expected


def test_select_module_subtree() -> None:
    expected = {
        f"layer1.{i}.{n}"
        for i in (0, 1)
        for n in ("conv1", "bn1", "relu", "conv2", "bn2", "add", "relu_1")
    }
    assert resnet_selected("layer1.*") == expected | {"layer1.0", "layer1.1"}


def test_select_with_exclusion() -> None:
    # "conv*" has no dot: it matches the last name component or the op (conv2d)
    expected = {"conv1", "layer2.0.downsample.0"} | {f"{b}.conv1" for b in BLOCKS}
    assert resnet_selected(["conv*", "!*.conv2"]) == expected


def test_select_callable_and_selector_algebra() -> None:
    def wide(point: Point) -> bool:
        return point.shape[1] == 16 and point.op == "relu" and not point.is_alias

    assert resnet_selected(wide) == {
        f"{b}.{r}" for b in ("layer2.0", "layer2.1") for r in ("relu", "relu_1")
    }
    selector = (
        Selector.in_module("layer2") & Selector.op("batchnorm2d") & ~Selector.glob("layer2.0.*")
    )
    assert resnet_selected(selector) == {"layer2.1.bn1", "layer2.1.bn2"}
    either = Selector.glob("fc") | Selector.module_type("MaxPool2d")
    assert resnet_selected(either) == {"fc", "maxpool"}


def test_select_matching_nothing_names_close_points() -> None:
    fm = ct.instrument(models.ResNet().eval(), select="layer1.0.rleu", sink=RecordingSink())
    with pytest.raises(SelectionError, match=r"layer1\.0\.relu"):
        fm(torch.randn(1, 3, 16, 16))


def test_select_none_is_the_plain_graph(sink: RecordingSink) -> None:
    model = models.CNN().eval()
    fm = ct.instrument(model, select=None, sink=sink)
    x = torch.randn(1, 3, 6, 6)
    lowered = fm.lowered(x)
    assert lowered.module is lowered.traced.traced.gm and not lowered.saves
    assert_same(fm(x), model(x))
    assert sink.calls == [] and sink.status == []  # nothing to record: the sink is not called


def test_parameters_are_shared() -> None:
    model = models.ResNet()
    fm = ct.instrument(model, select="fc", sink=RecordingSink())
    assert [id(p) for p in fm.parameters()] == [id(p) for p in model.parameters()]
    fm.trace(torch.randn(1, 3, 16, 16))
    lowered = fm.lowered(torch.randn(1, 3, 16, 16))
    assert lowered.module.get_submodule("fc") is model.fc
    assert len(list(fm.parameters())) == len(
        list(model.parameters())
    )  # lowered graphs not registered


def test_train_eval_trace_per_mode(sink: RecordingSink) -> None:
    model = models.CNN()
    reference = copy.deepcopy(model)
    fm = ct.instrument(model, select="bn", sink=sink)
    x = torch.randn(2, 3, 6, 6)
    for mode in (True, False, True):
        fm.train(mode)
        reference.train(mode)
        assert model.training is mode
        assert_same(fm(x), reference(x))
        assert_same(model.bn.running_mean, reference.bn.running_mean)
    assert len(sink.graphs) == 2
    assert [g.meta_value("training") for g in sink.graphs] == [True, False]


def test_no_grad_and_autograd_gradients_equal(sink: RecordingSink) -> None:
    model = models.ResNet().train()
    reference = copy.deepcopy(model)
    fm = ct.instrument(model, select="*", sink=sink)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        out = fm(x)
    assert not out.requires_grad
    model.load_state_dict(reference.state_dict())  # undo the running-stat update
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    fm(xa).square().sum().backward()
    reference(xb).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None, name
        assert_same(p.grad, q.grad)
    assert_same(xa.grad, xb.grad)


def test_one_trace_per_structure_not_per_shape(sink: RecordingSink) -> None:
    model = models.CNN().eval()
    fm = ct.instrument(model, select="conv", sink=sink)
    for size in (6, 6, 8, 6):
        x = torch.randn(1, 3, size, size)
        assert_same(fm(x), model(x))
        assert sink.values()["conv"].shape == (1, 6, size, size)
    assert len(sink.graphs) == 1 and fm.traces == 1
    graph_ids = [gid for call in sink.calls for gid, _ in call]
    assert graph_ids == [0, 0, 0, 0]
    x = torch.randn(1, 3, 6, 6)[None]  # a new rank: a new structure
    with pytest.raises(clouseau.TraceError):
        fm(x)
    fm.to(torch.float64)  # .to() drops the lowered graphs: buffers may be new tensors
    x = torch.randn(1, 3, 6, 6, dtype=torch.float64)
    assert_same(fm(x), model(x))
    assert len(sink.graphs) == 2 and fm.traces == 2


def test_trace_leaves_state_and_rng_alone() -> None:
    model = models.Dropper().train()
    cnn = models.CNN().train()
    branch = models.ShapeBranch().train()
    stats = copy.deepcopy(cnn.state_dict())
    inputs = torch.randn(2, 4), torch.randn(2, 3, 6, 6), torch.randn(2, 4, 6, 6)
    rng = torch.get_rng_state()
    ct.trace(model, inputs[0])
    ct.trace(cnn, inputs[1])
    ct.trace(branch, inputs[2])
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in cnn.state_dict().items():
        assert torch.equal(value, stats[key]), key


def test_dropout_in_train_mode_matches_eager(sink: RecordingSink) -> None:
    model = models.Dropper().train()
    fm = ct.instrument(model, select="drop", sink=sink)
    x = torch.randn(3, 4)
    fm.trace(x)
    torch.manual_seed(5)
    out = fm(x)
    torch.manual_seed(5)
    assert_same(out, model(x))


def test_untraceable_model_error() -> None:
    with pytest.raises(TraceError) as info:
        ct.trace(models.DataBranch(), torch.randn(2, 4))
    text = str(info.value)
    for part in (
        "DataBranch",
        "torch.fx failed",
        "torch.export failed",
        "models.py",
        "h.sum() > 0",
        "torch.cond",
        "mark_leaf",
    ):
        assert part in text, part


def test_mark_leaf_makes_it_traceable(sink: RecordingSink) -> None:
    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = models.DataBranch()
            self.out = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.inner(x))

    model = Wrapper()
    ct.mark_leaf(model.inner)
    x = torch.randn(2, 4)
    fm = ct.instrument(model, select="inner", sink=sink)
    assert_same(fm(x), model(x))
    assert sink.graphs[0].node("inner").op == "databranch"
    assert_same(sink.values()["inner"], model.inner(x))


def test_failed_call_is_reported_and_reraised(sink: RecordingSink) -> None:
    fm = ct.instrument(models.MLP(), select="fc1", sink=sink)
    sink.fail_put = True
    with pytest.raises(OSError, match="disk full"):
        fm(torch.randn(2, 8))
    assert sink.status == ["fail"] and isinstance(sink.errors[0], OSError)


def test_public_api_in_memory() -> None:
    model = models.ResNet().eval()
    x = torch.randn(1, 3, 16, 16)
    g = clouseau.trace(model, x)
    assert g.names()[:3] == ("x", "conv1", "bn1")
    with clouseau.instrument(model, select="layer1.*", path=None) as fm:
        out = fm(x)
        fm(x)
        captured = fm.captured
    assert_same(out, model(x))
    assert "layer1.0.relu_1" in captured.names()
    expected = {n for n in g.names() if n.startswith("layer1.")}
    assert set(captured.names()) == expected
    hook_out = model.layer1[0](model.maxpool(model.relu(model.bn1(model.conv1(x)))))
    assert_same(captured.get("layer1.0", call=1), hook_out)


def test_public_api_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = models.MLP()
    x = torch.randn(2, 8)
    with clouseau.instrument(model, select="act", path=tmp_path / "cap") as fm:
        fm(x)
    cap = clouseau.load(tmp_path / "cap")
    assert_same(cap["act"], torch.relu(model.fc1(x)))
    assert cap.graph is not None and "fc1" in cap.graph.names()


def test_host_arrays_outlive_what_the_user_does_after_the_call() -> None:
    # Saved values that escape the call (the input, a view of it, the output)
    # are copied to the host; values private to the call are shared, not copied.
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x)) + x.view(-1).sum()

    model = Net()
    fm = ct.instrument(model, select="*", sink=(sink := RecordingSink()))
    x = torch.randn(2, 4)
    expected = {"x": x.clone(), "view": x.view(-1).clone()}
    y = fm(x)
    expected["add"] = y.detach().clone()
    with torch.no_grad():
        x.add_(1.0)
        model.fc.weight.mul_(2.0)
        y.mul_(3.0)
    lowered = fm.lowered(torch.randn(2, 4))
    copies = dict(zip((s.attr("names")[0] for s in lowered.saves), lowered.host_copy, strict=True))
    assert copies["x"] and copies["view"] and copies["add"] and not copies["relu"]
    saved = sink.values(0)
    for name, value in expected.items():
        np.testing.assert_array_equal(saved[name], value.numpy())
