"""TorchDynamo's recompile limit: never a silently empty capture.

Once a code object has been compiled ``torch._dynamo.config.recompile_limit`` times in a
process (shared code: a model class's ``forward`` compiled for several instances, or
nn.Module's call wrapper), Dynamo runs it without compiling it and says so only in its
log. The dynamic tier compiles each instrumented model with its own cache of compiled
frames, so other models do not use up its recompiles; where its own calls reach the limit,
and where ``clouseau.backend`` meets it, the module outputs are still saved (forward hooks)
and a warning names the cause and the fix. The tests lower the limit to 1 to meet it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import clouseau
from tests.torch import dynamic_models as dm
from tests.torch.conftest import eager_with_hooks

LIMIT = "torch._dynamo.config.recompile_limit"


@pytest.fixture
def limit_of_one() -> Iterator[None]:
    with torch._dynamo.config.patch(recompile_limit=1):
        yield


def _same_module_outputs(captured: object, model: torch.nn.Module, x: torch.Tensor, call: int):
    expected, hooks = eager_with_hooks(model, x)
    assert hooks.outputs, "the model calls modules"
    for path, outputs in hooks.outputs.items():
        got = captured.get(path, call=call)  # type: ignore[attr-defined]
        assert got is not None, path
        np.testing.assert_array_equal(got, outputs[0].numpy())
    return expected


def _inputs(sign: float, rows: int = 3) -> torch.Tensor:
    return sign * (torch.rand(rows, 6) + 1)


@pytest.mark.usefixtures("limit_of_one")
def test_the_dynamic_tier_of_one_model_keeps_its_regions_after_others() -> None:
    """Three instances of one class: each compiles IfMean.forward, each in its own cache."""
    for seed in range(3):
        torch.manual_seed(seed)
        model = dm.IfMean().eval()
        fmodel = clouseau.instrument(model, select="*", path=None)
        for call, sign in enumerate((1.0, 1.0)):
            x = _inputs(sign)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with torch.no_grad():
                    out = fmodel(x)
            assert not [w for w in caught if LIMIT in str(w.message)]
            expected = _same_module_outputs(fmodel.captured, model, x, call)
            # The ops of the regions too: the last op is the model's output.
            np.testing.assert_array_equal(fmodel.captured.get("add", call=call), expected.numpy())
            np.testing.assert_array_equal(out.numpy(), expected.numpy())
            assert fmodel.captured.get("mean", call=call) is not None


@pytest.mark.usefixtures("limit_of_one")
def test_the_dynamic_tier_says_when_its_own_calls_reach_the_limit() -> None:
    torch.manual_seed(0)
    model = dm.IfMean().eval()
    fmodel = clouseau.instrument(model, select="*", path=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # A new shape recompiles the frames: the second compile of each is over the limit.
        xs = [_inputs(1.0), _inputs(1.0, rows=5), _inputs(-1.0, rows=7), _inputs(1.0)]
        with torch.no_grad():
            outs = [fmodel(x) for x in xs]
    said = [str(w.message) for w in caught if LIMIT in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "torch.compiler.reset()" in said[0] and "IfMean" in said[0]
    # Every call's module outputs all the same, from the hooks.
    for call, (x, out) in enumerate(zip(xs, outs, strict=True)):
        expected = _same_module_outputs(fmodel.captured, model, x, call)
        np.testing.assert_array_equal(out.numpy(), expected.numpy())


@pytest.mark.usefixtures("limit_of_one")
def test_the_backend_says_when_the_limit_is_reached_and_saves_the_module_outputs() -> None:
    for seed in range(2):  # the second compiled IfMean finds forward's one entry taken
        torch.manual_seed(seed)
        model = dm.IfMean().eval()
        backend = clouseau.backend(select="*", path=None, compiler="eager")
        compiled = torch.compile(model, backend=backend)
        for call, sign in enumerate((1.0, -1.0)):
            x = _inputs(sign)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with torch.no_grad():
                    out = compiled(x)
            said = [str(w.message) for w in caught if LIMIT in str(w.message)]
            assert len(said) == (1 if seed == 1 and call == 0 else 0), said
            expected = _same_module_outputs(backend.captured, model, x, call)
            np.testing.assert_array_equal(out.numpy(), expected.numpy())
        assert backend.captured.calls == (0, 1)
