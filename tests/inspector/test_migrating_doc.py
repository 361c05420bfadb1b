"""docs/migrating-from-hooks.md: its native selections pick what ``tail`` records."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import clouseau
from clouseau import Selector
from clouseau.ir.selection import select_points

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating-from-hooks.md"


def _module_outputs() -> Selector:
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert block, "the doc lost its module_outputs example"
    scope: dict[str, Any] = {}
    exec(block.group(1), scope)
    return scope["module_outputs"]


def _names(graph: clouseau.Graph, select: Any) -> set[str]:
    return {p.name for p in select_points(graph, select, strict=False)}


def _tail_keys(model: Any, x: Any, **options: Any) -> set[str]:
    from clouseau import inspector

    with inspector.tail(model, path="run", **options) as fmodel:
        fmodel(x)
    keys = inspector.read_from_safetensors("run")
    return {k.removesuffix("__call__").rstrip(".") for k in keys} - {""}


def test_the_native_equivalents_select_what_tail_records() -> None:
    torch = pytest.importorskip("torch")
    from tests.inspector.test_tail_torch import Net

    model, x = Net().eval(), torch.randn(2, 3)
    graph = clouseau.trace(model, x)
    module_outputs = _module_outputs()
    assert _names(graph, module_outputs) == _tail_keys(model, x)
    by_path = _tail_keys(model, x, filter_=lambda p, n: "linear" in p[-1])
    assert _names(graph, module_outputs & "*.linear*") == by_path


def test_the_native_equivalents_hold_for_equinox() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from tests.inspector.test_tail_jax import Net, build

    graph = clouseau.trace(build(Net), jnp.ones(3))
    module_outputs = _module_outputs()
    assert _names(graph, module_outputs) == {
        "embed", "dropout", "head",
        *(f"blocks.{b}{m}" for b in "01" for m in ("", ".linear1", ".act", ".linear2")),
    }  # fmt: skip
    assert _names(graph, module_outputs & "*.linear*") == {
        f"blocks.{b}.linear{i}" for b in "01" for i in "12"
    }
