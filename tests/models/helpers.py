"""Check an instrumented real model against eager: outputs and every module's output."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import clouseau
from clouseau.capture.torch import to_numpy
from clouseau.capture.torch.names import clean_paths, element_paths


class OutputHooks:
    """Every module call's tensor outputs, cloned when produced, by point name.

    The k-th call of a module is ``<path>_<k>``; a tuple, list, dict or ``ModelOutput``
    element is ``<name>:<index or key>``, and ``<name>`` alone is the first element.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.values: dict[str, torch.Tensor] = {}
        self.calls: dict[str, int] = {}
        paths = clean_paths(p for p, _ in model.named_modules(remove_duplicate=False))
        self.handles = [
            module.register_forward_hook(self._hook(paths[path]))
            for path, module in model.named_modules()
            if path
        ]

    def _hook(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            count = self.calls.get(path, 0)
            self.calls[path] = count + 1
            name = path if count == 0 else f"{path}_{count}"
            tensors = [(s, v) for s, v in element_paths(out) if isinstance(v, torch.Tensor)]
            for i, (suffix, value) in enumerate(tensors):
                self.values[name + suffix] = value.detach().clone()
                if i == 0:
                    self.values[name] = value.detach().clone()

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors of a model output (tuples, dicts, ModelOutput, cache objects)."""
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def assert_equal(actual: Any, expected: torch.Tensor, name: str) -> None:
    a = to_numpy(actual) if isinstance(actual, torch.Tensor) else np.asarray(actual)
    e = to_numpy(expected)
    assert a.shape == e.shape and a.dtype == e.dtype, (name, a.shape, e.shape, a.dtype, e.dtype)
    np.testing.assert_array_equal(a, e, err_msg=name)


def check_model(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``instrument(select="*", path=None)`` equals eager: outputs and every module output.

    Returns the capture's graph, for further checks.
    """
    hooks = OutputHooks(model)
    try:
        with torch.no_grad():
            expected = model(*args, **kwargs)
    finally:
        hooks.remove()
    assert hooks.values, "the model has no submodule outputs to compare"
    fmodel = clouseau.instrument(model, select="*", path=None)
    with torch.no_grad():
        actual = fmodel(*args, **kwargs)
    assert type(actual) is type(expected)
    got, want = tensors_of(actual), tensors_of(expected)
    assert len(got) == len(want)
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        assert_equal(a, e, f"output {i}")
    captured = fmodel.captured
    missing = sorted(set(hooks.values) - set(captured.names()))
    assert not missing, f"module outputs that are not points: {missing[:20]} ({len(missing)})"
    for name, value in hooks.values.items():
        assert_equal(captured[name], value, name)
    fmodel.close()
    return captured.graph
