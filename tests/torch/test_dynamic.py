"""The dynamic tier: models with data-dependent control flow, captured region by region.

Each call's saved module outputs equal forward hooks on the same eager call, the branch a
call takes is the one recorded, names are stable across calls, and a warning names the
tier and why the static tiers failed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture.torch.dynamic import regions
from tests.torch import dynamic_models as dm
from tests.torch.conftest import assert_same, eager_with_hooks

TIER = r"uses the dynamic \(TorchDynamo\) tier \(torch\.fx: .*; torch\.export: .*\)"


def _inputs(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3 + seed % 3, 6, generator=g) * (0.2 + seed % 4)


def _saved(cap: clouseau.Capture, path: str, call: int) -> list[np.ndarray]:
    """What the capture holds for module ``path`` in ``call``, one array per module call.

    A module run by a loop that Dynamo unrolled has names ``path``, ``path_1``...; one in a
    loop body region run several times has one name, saved once per run (stacked).
    """
    names = [path] + [f"{path}_{k}" for k in range(1, 64)]
    found: list[np.ndarray] = []
    for name in names:
        value = cap.get(name, call=call)
        if value is None:
            break
        runs = sum(1 for r in cap.records if r.call == call and name in r.names)
        found.extend(value if runs > 1 else [value])
    return found


def _check_calls(
    model: torch.nn.Module,
    make: Callable[[int], torch.Tensor],
    calls: int = 8,
    select: str = "*",
) -> clouseau.Capture:
    fmodel = clouseau.instrument(model, select=select, path=None)
    with pytest.warns(UserWarning, match=TIER):
        fmodel(make(0))
    for i in range(1, calls):
        x = make(i)
        torch.manual_seed(i)
        expected, hooks = eager_with_hooks(model, x)
        torch.manual_seed(i)
        with torch.no_grad():
            assert_same(fmodel(x), expected)
        cap = fmodel.captured
        for path, outputs in hooks.outputs.items():
            saved = _saved(cap, path, call=i)
            assert len(saved) == len(outputs), (path, i)
            for got, want in zip(saved, outputs, strict=True):
                assert_same(got, want)
    fmodel.close()
    return fmodel.captured


def _names(cap: clouseau.Capture, call: int) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n for r in cap.records if r.call == call for n in r.names))


def test_if_on_a_tensor_mean_records_the_branch_taken() -> None:
    cap = _check_calls(dm.IfMean(), _inputs)
    taken = {("up" in _names(cap, c), "down" in _names(cap, c)) for c in cap.calls}
    assert taken == {(True, False), (False, True)}  # both branches, never both in one call
    # Names are stable: every call that took a branch names its points alike.
    by_branch: dict[bool, set[tuple[str, ...]]] = {}
    for c in cap.calls:
        by_branch.setdefault("up" in _names(cap, c), set()).add(_names(cap, c))
    assert all(len(names) == 1 for names in by_branch.values())
    assert {"a", "mean", "gt", "up", "relu", "down", "mul", "add"} <= set(cap.names())


def test_nested_ifs() -> None:
    cap = _check_calls(dm.NestedIf(), _inputs, calls=10)
    branches = {tuple(p for p in ("b", "c", "neg") if p in _names(cap, c)) for c in cap.calls}
    assert len(branches) >= 2 and all(len(b) == 1 for b in branches)


def test_chained_boolean_conditions() -> None:
    cap = _check_calls(dm.ChainedConditions(), _inputs)
    assert {"b" in _names(cap, c) for c in cap.calls} == {True, False}


def test_while_loop_on_a_norm_saves_every_iteration() -> None:
    cap = _check_calls(dm.WhileNorm(), lambda i: _inputs(i) * 3)
    runs = [len(_saved(cap, "shrink", c)) for c in cap.calls]
    assert len(set(runs)) > 1  # the trip count follows the input


def test_top_k_moe_routing() -> None:
    # The `if mask.any()` inside the loop over experts makes Dynamo skip forward: the
    # hooks save every module output all the same, from the first call on, and the model
    # stays in the dynamic tier (ops of the frames Dynamo compiles are saved too).
    model = dm.TopKMoE()
    fmodel = clouseau.instrument(model, select="*", path=None)
    for i in range(6):
        x = _inputs(i) * 2
        expected, hooks = eager_with_hooks(model, x)
        if i == 0:
            with pytest.warns(UserWarning) as caught:
                assert_same(fmodel(x), expected)
            messages = [str(w.message) for w in caught]
            assert any("uses the dynamic (TorchDynamo) tier" in m for m in messages)
            assert not any("hook tier" in m for m in messages)
        else:
            assert_same(fmodel(x), expected)
        cap = fmodel.captured
        assert "gate" in _names(cap, i)
        for path, outputs in hooks.outputs.items():
            assert_same(cap.get(path, call=i), outputs[0])


def test_random_trip_count_under_a_fixed_seed() -> None:
    cap = _check_calls(dm.RandomDepth(), _inputs)
    assert len({len(_saved(cap, "fc", c)) for c in cap.calls}) > 1


def test_early_exit() -> None:
    cap = _check_calls(dm.EarlyExit(), lambda i: _inputs(i) * 2)
    assert {"second" in _names(cap, c) for c in cap.calls} == {True, False}


def test_select_and_graphs_of_the_dynamic_tier() -> None:
    model = dm.IfMean()
    # "down*" may pick ops too, so the call takes TorchDynamo, not the hooks alone.
    fmodel = clouseau.instrument(model, select=["up", "down*"], path=None)
    with pytest.warns(UserWarning, match=TIER):
        for i in range(6):
            fmodel(_inputs(i))
    cap = fmodel.captured
    assert set(cap.names()) == {"up", "down"}
    assert fmodel.traces == len(cap.graphs) >= 2
    assert all(g.trace_kind is clouseau.ir.TraceKind.TORCH_DYNAMO for g in cap.graphs)
    with pytest.raises(clouseau.TraceError, match="dynamic"):
        fmodel.trace(_inputs(0))


def test_a_call_that_raises_is_recorded_as_failed() -> None:
    fmodel = clouseau.instrument(dm.IfMean(), select="*", path=None)
    with pytest.warns(UserWarning, match=TIER):
        fmodel(_inputs(0))
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        fmodel(torch.randn(2, 5))  # the model's own error
    fmodel(_inputs(1))
    cap = fmodel.captured
    assert list(cap.failed_calls) == [1] and cap.calls == (0, 2)


def test_hooks_when_dynamo_fails_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: object, gm: object, example_inputs: object) -> None:
        raise NotImplementedError("this backend cannot compile")

    monkeypatch.setattr(regions.RegionCompiler, "__call__", broken)
    model = dm.IfMean()
    fmodel = clouseau.instrument(model, select="*", path=None)
    x = _inputs(1)
    with pytest.warns(UserWarning) as caught:
        out = fmodel(x)
    messages = [str(w.message) for w in caught]
    assert any("dynamic (TorchDynamo) tier" in m for m in messages)
    assert any("uses the hook tier (TorchDynamo: " in m for m in messages)
    expected, hooks = eager_with_hooks(model, x)
    assert_same(out, expected)
    cap = fmodel.captured
    call = cap.calls[-1]
    for path, outputs in hooks.outputs.items():
        assert_same(cap.get(path, call=call), outputs[0])


class _NoisyMoE(dm.TopKMoE):
    """A random draw, then the expert loop in ``super().forward``: Dynamo compiles this
    forward and skips the inherited one, whose modules the hooks save."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x + torch.rand_like(x))


def test_a_root_forward_dynamo_skips_draws_and_saves_as_eager() -> None:
    model = _NoisyMoE()
    fmodel = clouseau.instrument(model, select="*", path=None)
    x = _inputs(1) * 2
    torch.manual_seed(5)
    expected, hooks = eager_with_hooks(model, x)
    torch.manual_seed(5)
    with pytest.warns(UserWarning, match=TIER):
        assert_same(fmodel(x), expected)
    for path, outputs in hooks.outputs.items():
        assert_same(fmodel.captured.get(path, call=0), outputs[0])
    for seed in (6, 7):  # later calls, another shape too
        x = _inputs(seed) * 2
        torch.manual_seed(seed)
        expected, hooks = eager_with_hooks(model, x)
        torch.manual_seed(seed)
        assert_same(fmodel(x), expected)
        call = fmodel.captured.calls[-1]
        for path, outputs in hooks.outputs.items():
            assert len(_saved(fmodel.captured, path, call)) == len(outputs), path
            assert_same(fmodel.captured.get(path, call=call), outputs[0])


def test_dynamos_own_warnings_stay_off_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    # RandomDepth's int(tensor) is a graph break Dynamo warns about through logging.
    fmodel = clouseau.instrument(dm.RandomDepth(), select="*", path=None)
    with pytest.warns(UserWarning, match=TIER):
        for i in range(4):
            fmodel(_inputs(i))
    err = capfd.readouterr().err
    assert "Graph break" not in err and "torch._dynamo" not in err, err
