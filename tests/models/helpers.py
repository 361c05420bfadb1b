"""Check an instrumented real model against eager: outputs and every module's output."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import clouseau
from clouseau.capture.torch import to_numpy
from clouseau.capture.torch.naming.points import clean_paths, element_paths


class OutputHooks:
    """Every module call's tensor outputs, cloned when produced, per module path.

    ``calls[path]`` lists one ``{suffix: tensor}`` per call of the module: a tuple, list,
    dict or ``ModelOutput`` element has suffix ``:<index or key>`` and the first element
    also ``""``; :meth:`by_name` names them with the graph's ``module_calls``.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: dict[str, list[dict[str, torch.Tensor]]] = {}
        paths = clean_paths(p for p, _ in model.named_modules(remove_duplicate=False))
        self.handles = [
            module.register_forward_hook(self._hook(paths[path]))
            for path, module in model.named_modules()
            if path
        ]

    def _hook(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
            found: dict[str, torch.Tensor] = {}
            tensors = [(s, v) for s, v in element_paths(out) if isinstance(v, torch.Tensor)]
            for i, (suffix, value) in enumerate(tensors):
                found[suffix] = value.detach().clone()
                if i == 0:
                    found[""] = found[suffix]
            self.calls.setdefault(path, []).append(found)

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def by_name(self, graph: Any) -> dict[str, torch.Tensor]:
        """Every value by its point name, the k-th call of a module named as the graph says."""
        names: dict[str, list[str]] = {}
        for path, name in graph.meta_value("module_calls"):
            names.setdefault(path, []).append(name)
        found = {}
        for path, calls in self.calls.items():
            assert len(names.get(path, ())) == len(calls), (path, names.get(path), len(calls))
            for name, values in zip(names[path], calls, strict=True):
                found.update({name + suffix: v for suffix, v in values.items()})
        return found

    def named(self, graph: Any) -> dict[str, torch.Tensor]:
        """Every value by its point name: as the graph's ``module_calls`` says, or (a graph
        without them: the dynamic tier, the hook path) by docs/names.md's rule: a module's
        first call is its path, its k-th ``<path>_<k>`` with the first free ``k`` from the
        call's index on."""
        if graph.meta_value("module_calls") is not None:
            return self.by_name(graph)
        owned = set(self.calls)
        found: dict[str, torch.Tensor] = {}
        for path, calls in self.calls.items():
            for index, values in enumerate(calls):
                name, k = path, index
                while index and (name == path or name in owned):
                    name, k = f"{path}_{k}", k + 1
                owned.add(name)
                found.update({name + suffix: v for suffix, v in values.items()})
        return found


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
    assert hooks.calls, "the model has no submodule calls to compare"
    fmodel = clouseau.instrument(model, select="*", path=None)
    with torch.no_grad():
        actual = fmodel(*args, **kwargs)
    assert type(actual) is type(expected)
    got, want = tensors_of(actual), tensors_of(expected)
    assert len(got) == len(want)
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        assert_equal(a, e, f"output {i}")
    captured = fmodel.captured
    values = hooks.by_name(captured.graph)
    missing = sorted(set(values) - set(captured.names()))
    assert not missing, f"module outputs that are not points: {missing[:20]} ({len(missing)})"
    for name, value in values.items():
        assert_equal(captured[name], value, name)
    fmodel.close()
    return captured.graph
