"""torch.compile interop: ``torch.compile(fmodel)`` and ``clouseau.backend``.

Inductor fuses and reorders float arithmetic, so its values may differ from eager by
rounding: captures are compared with ``rtol=1e-5, atol=1e-6`` (docs/dynamic.md); with
``aot_eager`` (no code generation) they are bit-exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import clouseau
from tests.torch import dynamic_models as dm
from tests.torch import models
from tests.torch.conftest import eager_with_hooks

TOLERANCE = {"aot_eager": {"rtol": 0, "atol": 0}, "inductor": {"rtol": 1e-5, "atol": 1e-6}}
PATHS = ["conv", "bn", "head"]


def _close(actual: object, expected: torch.Tensor, compiler: str) -> None:
    np.testing.assert_allclose(np.asarray(actual), expected.numpy(), **TOLERANCE[compiler])


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, 3, 8, 8, generator=g) for b in (2, 2, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compiling_the_instrumented_model(compiler: str) -> None:
    model = models.CNN().eval()
    fmodel = clouseau.instrument(model, select=PATHS, path=None)
    compiled = torch.compile(fmodel, backend=compiler)
    for call, x in enumerate(_inputs()):
        expected, hooks = eager_with_hooks(model, x)
        with torch.no_grad():
            _close(compiled(x).numpy(), expected, compiler)
        for path in PATHS:
            _close(fmodel.captured.get(path, call=call), hooks.outputs[path][0], compiler)
    assert fmodel.captured.calls == (0, 1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_clouseau_as_the_backend(compiler: str, tmp_path: object) -> None:
    model = models.CNN().eval()
    with clouseau.backend(select=PATHS, path=tmp_path, compiler=compiler) as backend:
        compiled = torch.compile(model, backend=backend)
        outputs = []
        for x in _inputs():
            with torch.no_grad():
                outputs.append(compiled(x))
    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 1, 2) and set(cap.names()) == set(PATHS)
    for call, x in enumerate(_inputs()):
        expected, hooks = eager_with_hooks(model, x)
        _close(outputs[call].numpy(), expected, compiler)
        for path in PATHS:
            _close(cap.get(path, call=call), hooks.outputs[path][0], compiler)


def test_the_backend_with_graph_breaks_saves_each_region() -> None:
    model = dm.IfMean()
    backend = clouseau.backend(select=["a", "up", "down"], path=None, compiler="eager")
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(3, 6)
    expected, hooks = eager_with_hooks(model, x)
    with torch.no_grad():
        np.testing.assert_array_equal(compiled(x).numpy(), expected.numpy())
    cap = backend.captured
    taken = "up" if "up" in hooks.outputs else "down"
    # One user call is one call: the region before the branch and the branch's.
    assert cap.calls == (0,)
    np.testing.assert_array_equal(cap.get("a", call=0), hooks.outputs["a"][0].numpy())
    np.testing.assert_array_equal(cap.get(taken, call=0), hooks.outputs[taken][0].numpy())
    assert backend.traces > 0
    # Later calls too, whichever branch each takes (the root's hooks delimit them).
    for call, sign in enumerate((1.0, -1.0, 1.0, -1.0), start=1):
        if call == 3:
            traces = backend.traces  # both branches compiled: nothing more to compile
        _check_backend_call(model, compiled, backend, sign * (torch.rand(3, 6) + 1), call)
    assert backend.traces == traces


def _check_backend_call(
    model: torch.nn.Module, compiled: Any, backend: Any, x: torch.Tensor, call: int
) -> None:
    """Call ``call`` of ``compiled``: its output and every module output as eager's."""
    expected, hooks = eager_with_hooks(model, x)
    with torch.no_grad():
        np.testing.assert_array_equal(compiled(x).numpy(), expected.numpy())
    cap = backend.captured
    assert cap.calls == tuple(range(call + 1))
    for path, outputs in hooks.outputs.items():
        got = cap.get(path, call=call)
        assert got is not None, path
        np.testing.assert_array_equal(got, outputs[0].numpy())


class _BreakingBlock(torch.nn.Module):
    """A non-leaf module whose ``forward`` holds a graph break."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(x) + 1


class _Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _BreakingBlock()
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x) * 2)


def test_the_backend_with_a_graph_break_inside_a_submodule() -> None:
    torch.manual_seed(0)
    model = _Outer().eval()
    backend = clouseau.backend(select="*", path=None, compiler="eager")
    compiled = torch.compile(model, backend=backend)
    for call, rows in enumerate((3, 5)):  # two shapes
        _check_backend_call(model, compiled, backend, torch.randn(rows, 6), call)


class _Nested(torch.nn.Module):
    """The break two modules deep: ``outer.block`` is a ``_BreakingBlock``."""

    def __init__(self) -> None:
        super().__init__()
        self.outer = _Outer()
        self.norm = torch.nn.LayerNorm(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.outer(x)).tanh()


class _Layers(torch.nn.Module):
    """A loop over layers, each with a graph break in its ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_BreakingBlock() for _ in range(3))
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.mark.parametrize("make", [_Nested, _Layers], ids=["nested", "loop"])
def test_the_backend_with_graph_breaks_in_nested_modules(make: type[torch.nn.Module]) -> None:
    torch.manual_seed(0)
    model = make().eval()
    backend = clouseau.backend(select="*", path=None, compiler="eager")
    compiled = torch.compile(model, backend=backend)
    # Two shapes, each twice: every module output on every call, one capture call each.
    for call, rows in enumerate((3, 5, 3, 5)):
        _check_backend_call(model, compiled, backend, torch.randn(rows, 6), call)
    names = set(backend.captured.names())
    called = {p for p, m in model.named_modules() if p and not isinstance(m, torch.nn.ModuleList)}
    assert called <= names
    assert not any(n.startswith(("a", "b.")) or n == "b" for n in names), names


def test_the_backend_captures_the_compiled_calls_only() -> None:
    """The eager model called between compiled calls saves nothing into the capture."""
    torch.manual_seed(0)
    model = _Outer().eval()
    backend = clouseau.backend(select="*", path=None, compiler="eager")
    compiled = torch.compile(model, backend=backend)
    for call, rows in enumerate((3, 4)):
        _check_backend_call(model, compiled, backend, torch.randn(rows, 6), call)
        with torch.no_grad():
            model(torch.randn(7, 6))  # eager: not a call of the capture
    assert backend.captured.calls == (0, 1)
    assert backend.captured.get("head", call=1).shape == (4, 2)


def test_the_backend_on_a_sequential() -> None:
    """``nn.Sequential``'s forward is torch.nn code: Dynamo wraps the module in a function
    of its own and runs the root's hooks inside the compiled frame."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 2)
    ).eval()
    backend = clouseau.backend(select="*", path=None, compiler="eager")
    compiled = torch.compile(model, backend=backend)
    for call, batch in enumerate((2, 3, 2)):
        _check_backend_call(model, compiled, backend, torch.randn(batch, 3, 8, 8), call)
