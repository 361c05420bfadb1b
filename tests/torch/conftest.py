"""Shared helpers of the torch frontend tests: a recording sink and eager references."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue
from clouseau.ir.verify import verify


@dataclass
class FakeSink:
    """A Sink that keeps everything in lists, for checking what the frontend hands over."""

    graphs: list[Graph] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # "begin", "end", "fail" per call
    values: dict[int, list[tuple[int, SavedValue]]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    fail_put: bool = False

    def add_graph(self, graph: Graph) -> int:
        verify(graph)
        self.graphs.append(graph)
        return len(self.graphs) - 1

    def begin_call(self) -> int:
        self.calls.append("begin")
        return len(self.calls) - 1

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        if self.fail_put:
            raise OSError("disk full")
        self.values.setdefault(call, []).extend((graph_id, v) for v in values)

    def end_call(self, call: int) -> None:
        self.calls[call] = "end"

    def fail_call(self, call: int, error: BaseException) -> None:
        self.calls[call] = "fail"
        self.errors.append(error)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def capture(self) -> Any:
        return self.by_name()

    def by_name(self, call: int | None = None) -> dict[str, np.ndarray]:
        """Every saved array by every one of its names (the last call by default)."""
        call = max(self.values) if call is None else call
        return {name: v.array for _, v in self.values.get(call, []) for name in v.names}


@pytest.fixture
def sink() -> FakeSink:
    return FakeSink()


@pytest.fixture(autouse=True)
def _seed() -> Iterator[None]:
    torch.manual_seed(0)
    yield


class Hooks:
    """Eager references: every module's inputs and outputs, cloned when produced.

    Cloning inside the hook takes the value before any later in-place op changes it.
    ``outputs[path]`` and ``inputs[path]`` list one entry per call of the module.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.outputs: dict[str, list[Any]] = {}
        self.inputs: dict[str, list[tuple[Any, ...]]] = {}
        self.handles = []
        for path, module in model.named_modules():
            if path:
                self.handles.append(module.register_forward_pre_hook(self._pre(path)))
                self.handles.append(module.register_forward_hook(self._post(path)))

    def _pre(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            self.inputs.setdefault(path, []).append(tuple(_clone(a) for a in args))

        return hook

    def _post(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], out: Any) -> None:
            self.outputs.setdefault(path, []).append(_clone(out))

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(_clone(v) for v in value)
    return value


def eager_with_hooks(model: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Hooks]:
    hooks = Hooks(model)
    try:
        with torch.no_grad():
            out = model(*args, **kwargs)
    finally:
        hooks.remove()
    return out, hooks


def assert_same(actual: Any, expected: Any) -> None:
    """Bit-for-bit equality of a captured numpy array (or tensor) with an eager tensor."""
    from clouseau.capture.torch import to_numpy

    actual = to_numpy(actual) if isinstance(actual, torch.Tensor) else actual
    expected = to_numpy(expected) if isinstance(expected, torch.Tensor) else expected
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)
