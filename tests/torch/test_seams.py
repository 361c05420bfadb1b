"""The seams between tiers lose nothing: every module output of every call, call 0 and a
new shape included, equals a forward hook on the same eager call (bitwise).

Module outputs reach the capture through the one forward-hook implementation wherever
Python runs a module's ``forward``; these are the models whose calls used to lose or
misplace them (issue #25): data-dependent models on the dynamic tier, and transformers'
mixtures of experts whose experts run in a Python loop.
"""

from __future__ import annotations

import fnmatch
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture.torch.naming.points import element_paths
from tests.torch import dynamic_models as dm


def eager_points(
    model: torch.nn.Module, *args: Any, **kwargs: Any
) -> tuple[Any, dict[str, torch.Tensor]]:
    """The model's eager output and every module call's tensor outputs, by point name:
    the k-th call of a module ``<path>_<k>``, elements ``:<i>``, the first also ``<path>``."""
    found: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(path: str) -> Callable[..., None]:
        def record(module: torch.nn.Module, inputs: Any, out: Any) -> None:
            k = counts.get(path, 0)
            counts[path] = k + 1
            name = path if k == 0 else f"{path}_{k}"
            tensors = [(s, v) for s, v in element_paths(out) if isinstance(v, torch.Tensor)]
            for i, (suffix, value) in enumerate(tensors):
                found[name + suffix] = value.detach().clone()
                if i == 0:
                    found.setdefault(name, found[name + suffix])

        return record

    handles = [m.register_forward_hook(hook(p)) for p, m in model.named_modules() if p]
    try:
        with torch.no_grad():
            out = model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return out, found


def check_every_call(model: torch.nn.Module, inputs: list[torch.Tensor], select: Any = "*") -> Any:
    """Each call's module outputs equal eager hooks, none missing (``select`` picks them
    all: ``"*"``, or every module's output and elements on the hook path)."""
    fmodel = clouseau.instrument(model, select=select, path=None)
    for i, x in enumerate(inputs):
        torch.manual_seed(i)
        expected, points = eager_points(model, x)
        torch.manual_seed(i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tier's warning, on call 0
            with torch.no_grad():
                out = fmodel(x)
        for got, want in zip(_tensors(out), _tensors(expected), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        cap = fmodel.captured
        call = cap.calls[-1]
        assert call == i and not cap.failed_calls
        points = _selected(points, select)
        missing = [name for name in points if cap.get(name, call=call) is None]
        assert not missing, (i, missing)
        for name, want in points.items():
            np.testing.assert_array_equal(cap.get(name, call=call), want.numpy(), err_msg=name)
    return fmodel


def _selected(points: dict[str, torch.Tensor], select: Any) -> dict[str, torch.Tensor]:
    """The points a list of module globs picks (a module's elements and repeats with it)."""
    if select == "*":
        return points
    globs = (select,) if isinstance(select, str) else tuple(select)
    return {
        name: value
        for name, value in points.items()
        if any(
            fnmatch.fnmatchcase(base, g) or fnmatch.fnmatchcase(re.sub(r"_\d+$", "", base), g)
            for base in (name.split(":")[0],)
            for g in globs
        )
    }


def _tensors(value: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _rows(seed: int, rows: int, scale: float) -> torch.Tensor:
    return torch.randn(rows, 6, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize(
    ("make", "scales"),
    [
        (dm.EarlyExit, (0.5, 3.0, 0.5, 3.0)),  # exits early on some calls only
        (dm.WhileNorm, (3.0, 0.3, 6.0, 1.5)),  # a loop until a norm condition
        (dm.TopKMoE, (2.0, 2.0, 2.0, 2.0)),  # a root forward Dynamo skips
        (dm.RandomDepth, (1.0, 1.0, 1.0, 1.0)),
    ],
    ids=["early_exit", "while_norm", "root_skipped", "random_depth"],
)
def test_data_dependent_models_save_every_module_on_every_call(
    make: Callable[[], torch.nn.Module], scales: tuple[float, ...]
) -> None:
    torch.manual_seed(0)
    inputs = [_rows(i, 3 if i % 2 == 0 else 5, s) for i, s in enumerate(scales)]  # two shapes
    check_every_call(make(), inputs)


@pytest.mark.parametrize(
    "make",
    [dm.EarlyExit, dm.WhileNorm, dm.TopKMoE],
    ids=["early_exit", "while_norm", "root_skipped"],
)
def test_the_dynamic_tiers_model_input_is_a_point_on_every_call(
    make: Callable[[], torch.nn.Module],
) -> None:
    # The input goes straight into a hooked module: Dynamo sees it only in that module's
    # frame (or in none, where the root frame is skipped), whose inputs are no points.
    torch.manual_seed(0)
    inputs = [_rows(i, 3 if i % 2 == 0 else 5, 2.0) for i in range(3)]
    fmodel = check_every_call(make(), inputs)
    cap = fmodel.captured
    assert cap.graph.trace_kind is clouseau.ir.TraceKind.TORCH_DYNAMO
    assert cap.graph.meta_value("tier") != "inputs"  # the first graph is the model's own
    for call, x in zip(cap.calls, inputs, strict=True):
        np.testing.assert_array_equal(cap.get("x", call=call), x.numpy())


def _qwen2_moe() -> torch.nn.Module:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        experts_implementation="eager",
    )  # fmt: skip
    return Qwen2MoeForCausalLM(config).eval()


def _olmoe() -> torch.nn.Module:
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = OlmoeConfig(
        vocab_size=97, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        experts_implementation="eager",
    )  # fmt: skip
    return OlmoeForCausalLM(config).eval()


@pytest.mark.parametrize("make", [_qwen2_moe, _olmoe], ids=["qwen2_moe", "olmoe"])
def test_moe_with_an_eager_expert_loop_saves_every_module_on_every_call(
    make: Callable[[], torch.nn.Module],
) -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = make()
    ids = [torch.randint(0, 97, shape) for shape in ((2, 7), (2, 7), (2, 11))]
    fmodel = check_every_call(model, ids)
    # Layer 1's shared expert holds its own values, not layer 0's.
    names = fmodel.captured.names()
    assert any(n.startswith("model.layers.1.mlp") for n in names)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # the block's output is its fc's: one value, two names


class _Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.layers = torch.nn.ModuleList(_Block() for _ in range(2))
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids) * attention_mask[..., None]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def test_record_rows_globs_match_module_outputs_on_the_traced_path(tmp_path: Any) -> None:
    """``rows=["layers.?"]``: a block's output is its ``fc``'s value (named ``layers.0.fc``
    first, ``layers.0`` beside); the glob matches a value by any of its names."""
    torch.manual_seed(0)
    model = _Decoder().eval()
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[1, 4:] = 0
    ids = torch.randint(1, 20, (4, 6)) * mask
    data = [{"input_ids": ids[i : i + 2], "attention_mask": mask[i : i + 2]} for i in (0, 2)]
    cap = clouseau.record(
        model, data, select=["layers.*", "norm"], path=tmp_path / "acts",
        rows=["layers.?"], mask="attention_mask", progress=False,
    )  # fmt: skip
    assert cap.graph.trace_kind is not clouseau.ir.TraceKind.TORCH_HOOKS  # the traced path
    for call, start in enumerate((0, 2)):
        batch = slice(start, start + 2)
        _, points = eager_points(model, ids[batch], mask[batch])
        keep = mask[batch].reshape(-1).bool()
        for layer in ("layers.0", "layers.1"):
            want = points[layer].reshape(-1, 8)[keep].numpy()  # rows: padding dropped
            np.testing.assert_array_equal(np.asarray(cap.get(layer, call=call)), want)
        np.testing.assert_array_equal(  # not in rows=: as the model gives it
            np.asarray(cap.get("norm", call=call)), points["norm"].numpy()
        )
