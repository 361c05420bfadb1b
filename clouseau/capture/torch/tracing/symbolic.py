"""Which dimensions of a traced graph's values may change from call to call.

A graph is traced once per input *structure* (pytree, dtypes, ranks, devices, mode), not
per shape, so its IR says which sizes follow the inputs: ``f32[s0,16,64]``. For an fx
graph (shape-generic by construction) the graph is run once on fake tensors whose every
input dimension is a symbol; what the model pins (a Linear's ``in_features``, a conv's
channels) folds back to a number. For an exported graph the symbols are torch.export's
own. Either way the symbols are renamed ``s0``, ``s1``, ... in the order the inputs meet
them, so two traces of one model print alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch._compat import (
    dynamic_fake_mode,
    fake_from_tensor,
    simplified,
    tree_leaves,
)
from clouseau.capture.torch.naming.points import is_leaf_class
from clouseau.capture.torch.tracing.export_hooks import is_hooks_runner
from clouseau.capture.torch.tracing.probe import restoring_buffers

Symbols = tuple[str, ...]


# The symbolic run only labels the IR; on large graphs sympy's simplification makes it
# cost minutes (torchvision's maxvit_t: over 10 min here) where the trace takes seconds.
# Past this many nodes the IR shows the traced shapes; the graph is shape-generic all the same.
MAX_SYMBOLIC_NODES = 400


def fx_symbols(
    gm: fx.GraphModule, model: torch.nn.Module, inputs: tuple[Any, ...]
) -> dict[str, Symbols]:
    """Per fx node name, the symbols of its tensor value (only where some dim is dynamic).

    Empty when the graph cannot run on fake tensors (a data-dependent op) or has more than
    :data:`MAX_SYMBOLIC_NODES` nodes: the IR then shows the traced shapes, and the graph
    stays as shape-generic as it is.
    """
    if len(gm.graph.nodes) > MAX_SYMBOLIC_NODES:
        return {}
    try:
        mode, env = dynamic_fake_mode()
        fakes = tuple(_fake(mode, x) for x in inputs)
        values: dict[str, Any] = {}
        # Scalar buffers (BatchNorm's counter) may run for real: keep the model as it was.
        with torch.no_grad(), restoring_buffers(model), mode:
            _Runner(gm, values).run(*fakes)
    except Exception:
        return {}
    rename = _renamer(v for x in fakes for v in tree_leaves(x))
    return _symbols(values, lambda e: simplified(env, e), rename)


def export_symbols(graph: fx.Graph, key: str = "val") -> dict[str, Symbols]:
    """Per fx node name of an exported graph, the symbols of its tensor value.

    ``key``: the node meta holding the fake value (``example_value`` in Dynamo's graphs).
    """
    placeholders = [n.meta.get(key) for n in graph.nodes if n.op == "placeholder"]
    rename = _renamer(placeholders)
    values = {n.name: n.meta.get(key) for n in graph.nodes}
    return _symbols(values, lambda e: e, rename)


# Modules whose output has their input's shape: their fake run is skipped (BatchNorm's
# decomposition under symbolic shapes is most of a CNN's propagation time).
_SAME_SHAPE = (
    torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
    torch.nn.ReLU, torch.nn.ReLU6, torch.nn.GELU, torch.nn.SiLU, torch.nn.Tanh,
    torch.nn.Sigmoid, torch.nn.LeakyReLU, torch.nn.ELU, torch.nn.Hardswish,
    torch.nn.Hardsigmoid, torch.nn.Mish, torch.nn.Softmax, torch.nn.LogSoftmax,
    torch.nn.Identity, torch.nn.modules.dropout._DropoutNd,
)  # fmt: skip


class _Runner(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, values: dict[str, Any]) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.values = values

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        module = self.fetch_attr(str(target))
        if isinstance(module, _SAME_SHAPE) and len(args) == 1 and not kwargs:
            return torch.empty_like(args[0]) if isinstance(args[0], torch.Tensor) else args[0]
        if not is_leaf_class(type(module)):
            # A user's leaf (mark_leaf) may have Python side effects: no second run.
            raise _UserLeafError(str(target))
        # forward, not __call__: a shape run is no call of the model (no user hooks).
        return module.forward(*args, **kwargs)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if is_hooks_runner(target):  # the user's hooks: assumed to keep the output's shape
            return args[-1]
        return super().call_function(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        self.values[n.name] = result
        return result


class _UserLeafError(Exception):
    """A user's leaf module: the graph is not run on fake tensors."""


def _fake(mode: Any, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fake_from_tensor(mode, value)
    if isinstance(value, list | tuple):
        return type(value)(_fake(mode, v) for v in value)
    if isinstance(value, dict):
        return {k: _fake(mode, v) for k, v in value.items()}
    return value


def _renamer(values: Iterable[Any]) -> dict[Any, Any]:
    """Each free symbol of the inputs' sizes -> ``s<i>``, in the order met."""
    import sympy

    rename: dict[Any, Any] = {}
    for value in values:
        if not isinstance(value, torch.Tensor):
            continue
        for dim in value.shape:
            if isinstance(dim, torch.SymInt):
                for sym in sorted(dim.node.expr.free_symbols, key=str):
                    rename.setdefault(sym, sympy.Symbol(f"s{len(rename)}", integer=True))
    return rename


def _symbols(
    values: Mapping[str, Any], simplify: Any, rename: dict[Any, Any]
) -> dict[str, Symbols]:
    found: dict[str, Symbols] = {}
    for name, value in values.items():
        if not isinstance(value, torch.Tensor):
            continue
        dims = tuple(_dim(d, simplify, rename) for d in value.shape)
        if any(dims):
            found[name] = dims
    return found


def _dim(dim: Any, simplify: Any, rename: dict[Any, Any]) -> str:
    if not isinstance(dim, torch.SymInt):
        return ""
    expr = simplify(dim.node.expr)
    if expr.is_number:
        return ""
    return _unwrap(str(expr.xreplace(rename)).replace(" ", ""))


def _unwrap(text: str) -> str:
    """Drop parentheses that only wrap another pair: ``(((s1-1)//2))+1`` -> ``((s1-1)//2)+1``."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, c in enumerate(text):
        if c == "(":
            stack.append(i)
        elif c == ")" and stack:
            pairs[stack.pop()] = i
    drop = {j for i, end in pairs.items() if pairs.get(i + 1) == end - 1 for j in (i, end)}
    return "".join(c for i, c in enumerate(text) if i not in drop)
