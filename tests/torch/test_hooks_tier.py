"""The hook path (a selection of module outputs only): the traced tiers' names and
values, from forward hooks with no trace.

Each model runs once through the traced path and once through the hook path with the same
selection; both captures hold the same names, with equal values.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture.torch.runtime.hooks import module_paths_selected
from clouseau.ir.graph import TraceKind
from clouseau.ir.selection import as_selector


def _gpt2() -> tuple[torch.nn.Module, tuple[Any, ...], list[str]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=64)
    model = GPT2LMHeadModel(config).eval()
    select = ["transformer.h.*.mlp", "transformer.h.0.attn", "transformer.h.1.attn:0",
              "transformer.h.0.ln_1", "transformer.wte"]  # fmt: skip
    return model, (torch.randint(0, 97, (2, 7)),), select


def _bert() -> tuple[torch.nn.Module, tuple[Any, ...], list[str]]:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        vocab_size=97, max_position_embeddings=64,
    )  # fmt: skip
    model = BertModel(config).eval()
    select = ["encoder.layer.*.output", "embeddings.word_embeddings", "encoder.layer.0.attention",
              "pooler.activation"]  # fmt: skip
    return model, (torch.randint(0, 97, (2, 9)),), select


def _resnet() -> tuple[torch.nn.Module, tuple[Any, ...], list[str]]:
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=10).eval()
    # bn2's output is changed in place later (out += identity; relu(inplace=True)); the
    # block's ReLU module runs twice: layer1.0.relu, then layer1.0.relu_1.
    select = ["layer1.0.bn2", "layer1.0.relu", "layer1.0.relu_1", "layer2.*.bn2", "layer4.1"]
    return model, (torch.randn(2, 3, 32, 32),), select


@pytest.mark.parametrize("make", [_gpt2, _bert, _resnet])
def test_hooks_name_and_save_what_the_trace_does(make: Any) -> None:
    torch.manual_seed(0)
    model, args, select = make()
    # The same selection as a Selector object: the hook path takes globs only.
    traced = clouseau.instrument(model, select=as_selector(select), path=None)
    with torch.no_grad():
        traced(*args)
    hooked = clouseau.instrument(model, select=select, path=None)
    with torch.no_grad():
        hooked(*args)
    want, got = traced.captured, hooked.captured
    assert want.graph.trace_kind is not TraceKind.TORCH_HOOKS
    assert got.graph.trace_kind is TraceKind.TORCH_HOOKS
    assert hooked.traces == 0
    assert set(got.names()) == set(want.names())
    for name in want.names():
        np.testing.assert_array_equal(got.get(name, call=0), want.get(name, call=0))


def test_many_shapes_one_graph_and_each_calls_values() -> None:
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    fmodel = clouseau.instrument(model, select=["0.0", "0.1"], path=None)
    inputs = [torch.randn(n, 4) for n in (3, 1, 7, 2)]
    for x in inputs:
        fmodel(x)
    cap = fmodel.captured
    assert len(cap.graphs) == 1 and fmodel.traces == 0
    for call, x in enumerate(inputs):
        with torch.no_grad():
            np.testing.assert_array_equal(cap.get("0.0", call=call), model[0][0](x).numpy())


def test_a_failing_call_is_recorded_as_failed() -> None:
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(3, 3)))
    fmodel = clouseau.instrument(model, select=["0.0"], path=None)
    capture = fmodel._hook_capture()
    with pytest.raises(RuntimeError), capture.installed((model,)):
        model(torch.ones(2, 4))  # the model's own error
    x = torch.ones(1, 4)
    with capture.installed((model,)):
        model[0][0](x)  # not a root: no call
        model[0][1] = torch.nn.Linear(4, 3)
        model(x)  # the next call works
    cap = fmodel.captured
    assert cap.calls == (1,) and set(cap.failed_calls) == {0}
    np.testing.assert_array_equal(cap.get("0.0", call=1), model[0][0](x).detach().numpy())


class _Reentrant(torch.nn.Module):
    """A model whose forward calls its own instrumented model (held outside the module
    tree): the inner call is part of the outer one, its module calls the second ones."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.inner: Any = None

    def forward(self, x: torch.Tensor, depth: int = 0) -> torch.Tensor:
        y = self.fc(x)
        return y + self.inner(x, depth=1) if depth == 0 else y


def test_a_model_calling_its_instrumented_self_is_one_call_not_a_hang() -> None:
    torch.manual_seed(0)
    model = _Reentrant()
    fmodel = clouseau.instrument(model, select=["fc", "fc_1"], path=None)
    object.__setattr__(model, "inner", fmodel)  # not a submodule: no cycle in the tree
    x = torch.randn(2, 4)
    done: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: done.update(out=fmodel(x)), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the nested call waited on the outer call's lock"
    want = model.fc(x)
    np.testing.assert_array_equal(done["out"].detach().numpy(), (want + want).detach().numpy())
    cap = fmodel.captured
    assert cap.calls == (0,)
    for name in ("fc", "fc_1"):
        np.testing.assert_array_equal(cap.get(name, call=0), want.detach().numpy())


@pytest.mark.parametrize(
    ("select", "module_only"),
    [
        ("layer1.0.relu", True),
        (["layer*.0.bn2", "!layer2.0.bn2"], True),
        ("layer1.0.relu_1", True),
        ("layer1.0:0", True),
        ("relu", False),  # dotless: also every relu op
        ("layer1.*.relu", False),  # a wildcard and a torch function's name: maybe an op
        ("layer1.0.*", False),
        ("layer1.0.add", False),  # not a module
        (lambda p: True, False),
        ("!layer1.0.relu", False),
    ],
)
def test_which_selections_take_the_hook_path(select: Any, module_only: bool) -> None:
    from torchvision.models import resnet18

    found = module_paths_selected(resnet18(weights=None), select)
    assert (found is not None) == module_only


def test_a_rerun_that_fails_before_any_output_keeps_the_previous_capture(tmp_path) -> None:
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    xs = [torch.randn(2, 4) for _ in range(3)]
    with clouseau.instrument(model, select="0.1", path=tmp_path) as fmodel:
        for x in xs:
            fmodel(x)

    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != ".clouseau.lock"}

    before = files()
    rerun = clouseau.instrument(model, select="0.1", path=tmp_path)
    with pytest.raises(RuntimeError):
        rerun(torch.randn(2, 5))  # a wrong input: the Linear fails before "0.1" is met
    rerun.close()
    assert rerun.traces == 0 and files() == before
    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 1, 2)
    with torch.no_grad():
        for call, x in enumerate(xs):
            np.testing.assert_array_equal(cap.get("0.1", call=call), model(x).numpy())


@pytest.mark.parametrize(
    ("select", "paths"),
    [
        ("layer1", ("layer1",)),
        ("conv1", ("conv1", *(f"layer{i}.{j}.conv1" for i in range(1, 5) for j in (0, 1)))),
        (["fc", "layer4.1.bn2"], ("fc", "layer4.1.bn2")),
        ("relu", None),  # also every relu op
        ("layer*", None),
        ("nothing", None),
    ],
)
def test_dotless_module_names_for_a_model_no_tracer_traces(
    select: Any, paths: tuple[str, ...] | None
) -> None:
    # Past both tracers (module.py), a dotless glob that names modules by their last
    # component, without wildcards and not an op's name, picks module outputs only.
    from torchvision.models import resnet18

    model = resnet18(weights=None)
    assert module_paths_selected(model, select) is None
    assert module_paths_selected(model, select, dotless=True) == paths
