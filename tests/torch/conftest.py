"""Shared helpers of the torch frontend tests: eager references (the recording sink is
tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch


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
