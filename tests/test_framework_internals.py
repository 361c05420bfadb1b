"""Private framework internals only in a ``_compat.py``, read from the source (AST).

A private internal is a module or attribute of a framework whose dotted path has a part
that starts with one underscore (``torch._dynamo.exc``, ``torch.utils._pytree``,
``jax._src``), or one of the private attributes of framework objects in
:data:`PRIVATE_ATTRIBUTES` (``module._forward_hooks``, ``tensor._version``), read as an
attribute or through ``getattr``. When a framework release moves one, the ``_compat.py``
modules of :data:`COMPAT` are the only ones to change: each frontend's, and the
exporters' (which may not import a frontend). Names in strings (logger names) do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_layering import MODULES

FRAMEWORKS = frozenset({"torch", "jax", "jaxlib", "equinox", "flax", "onnx", "onnxruntime"})
PRIVATE_ATTRIBUTES = frozenset({
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_version",
    "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
})  # fmt: skip

# The only modules that may touch them. The exporters' own: they may not import a frontend.
COMPAT = frozenset({
    "clouseau.capture.torch._compat", "clouseau.capture.jax._compat", "clouseau.exporters._compat",
})  # fmt: skip

# The torch frontend's rewrite (#25, branch torch) moves these into capture/torch/_compat.py;
# the coordinator empties this afterwards. An entry that no longer occurs fails
# test_known_internals_still_occur, so that the list never outlives its use.
KNOWN_USES: frozenset[tuple[str, str]] = frozenset({
    ("clouseau.capture.torch.runtime.signature", "torch.utils._pytree"),
    ("clouseau.capture.torch.tracing.symbolic", "torch.nn.modules.batchnorm._BatchNorm"),
    ("clouseau.capture.torch.tracing.symbolic", "torch.nn.modules.dropout._DropoutNd"),
})  # fmt: skip


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """``torch.utils._pytree.tree_leaves`` -> ("torch", ["utils", "_pytree", "tree_leaves"])."""
    attrs: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        attrs.insert(0, current.attr)
        current = current.value
    return (current.id, attrs) if isinstance(current, ast.Name) else None


def _framework_import(node: ast.AST) -> ast.Import | ast.ImportFrom | None:
    if isinstance(node, ast.Import) and any(a.name.split(".")[0] in FRAMEWORKS for a in node.names):
        return node
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return node if node.module.split(".")[0] in FRAMEWORKS else None
    return None


def _imported(node: ast.Import | ast.ImportFrom) -> dict[str, str]:
    """Local name -> the framework module or object bound (``import torch.fx as fx``)."""
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    bound: dict[str, str] = {}
    for alias in node.names:
        root = alias.name.split(".")[0]
        if root in FRAMEWORKS:
            bound[alias.asname or root] = alias.name if alias.asname else root
    return bound


def _attribute_uses(node: ast.Attribute, bound: dict[str, str]) -> set[str]:
    found = {f"<object>.{node.attr}"} if node.attr in PRIVATE_ATTRIBUTES else set()
    chain = _chain(node)
    if chain is not None and chain[0] in bound:
        found.add(".".join([bound[chain[0]], *chain[1]]))
    return found


def _getattr_uses(node: ast.Call) -> set[str]:
    """``getattr(module, "_forward_hooks")`` and its kin."""
    if not (isinstance(node.func, ast.Name) and node.func.id in _GETATTRS and len(node.args) > 1):
        return set()
    name = node.args[1]
    if isinstance(name, ast.Constant) and name.value in PRIVATE_ATTRIBUTES:
        return {f"<object>.{name.value}"}
    return set()


def _uses_of(node: ast.AST, bound: dict[str, str]) -> set[str]:
    """The framework paths (private or not) one AST node touches."""
    imported = _framework_import(node)
    if imported is not None:
        return set(_imported(imported).values())
    if isinstance(node, ast.Attribute):
        return _attribute_uses(node, bound)
    return _getattr_uses(node) if isinstance(node, ast.Call) else set()


_GETATTRS = ("getattr", "hasattr", "setattr")


def uses(path: Path) -> set[str]:
    """The private framework internals the source of ``path`` touches."""
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        imported = _framework_import(node)
        bound |= _imported(imported) if imported is not None else {}
    found = set().union(*(_uses_of(node, bound) for node in ast.walk(tree)))
    return {_shortest_private(u) for u in found if _private(u)}


def _shortest_private(dotted: str) -> str:
    """``torch.utils._pytree.tree_leaves`` -> ``torch.utils._pytree`` (what moved, if it does)."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[: i + 1])
    return dotted


def _outside_compat() -> set[tuple[str, str]]:
    return {
        (module, use)
        for module, path in MODULES.items()
        if module not in COMPAT
        for use in uses(path)
    }


def test_the_compat_modules_exist_and_the_architecture_page_names_them() -> None:
    page = (MODULES["clouseau"].parents[1] / "docs" / "architecture.md").read_text()
    for module in sorted(COMPAT):
        path = MODULES[module].relative_to(MODULES["clouseau"].parents[1]).as_posix()
        assert f"`{path}`" in page, f"docs/architecture.md does not name {path}"


def test_framework_internals_only_in_compat_modules() -> None:
    found = sorted(_outside_compat() - KNOWN_USES)
    lines = [f"{module} uses {use}: move it into a _compat.py" for module, use in found]
    assert not lines, "\n".join(lines)


def test_known_internals_still_occur() -> None:
    stale = sorted(KNOWN_USES - _outside_compat())
    assert not stale, f"{stale} no longer occur: remove them from KNOWN_USES"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import torch\ntorch._dynamo.reset()", {"torch._dynamo"}),
        ("import torch.utils._pytree as p", {"torch.utils._pytree"}),
        ("from torch._dynamo.exc import Unsupported", {"torch._dynamo"}),
        ("from jax._src import core", {"jax._src"}),
        ("import jax.extend as jex\njex.core.jaxpr_as_fun", set()),
        ("from torch import fx\nfx._symbolic_trace.Tracer", {"torch.fx._symbolic_trace"}),
        ("def f(m):\n    return m._forward_hooks", {"<object>._forward_hooks"}),
        ("def f(t):\n    return getattr(t, '_version')", {"<object>._version"}),
        ("import logging\nlogging.getLogger('torch._dynamo')", set()),
        ("import torch\ntorch.__version__", set()),
        ("class A:\n    def f(self):\n        return self._hooks", set()),
    ],
)
def test_the_reader_finds_what_it_should(tmp_path: Path, source: str, found: set[str]) -> None:
    path = tmp_path / "example.py"
    path.write_text(source)
    assert uses(path) == found
