"""The package's layering, read from its source: who may import whom, no import cycles,
modules within the line budget.

``clouseau/ir`` is the shared core: it imports nothing from the frontends (``capture``), the
store or the exporters. Frontends and exporters never import each other: an exporter receives
what a frontend lowered through the public API layer. Frontends hand values to a ``Sink``
(``ir/sink.py``), never to the store itself, and the store knows no frontend. The capture
directory's names and markers are spelled once, in ``store/layout.py``. Only module-level imports count for
cycles (an import inside a function is the documented way to defer a framework).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "clouseau"
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_targets(module: str, is_package: bool, node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom):
        source = _resolve(module, is_package, node)
        return {source, *(f"{source}.{alias.name}" for alias in node.names)}
    return set()


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run at import time (``if``/``try`` blocks included, TYPE_CHECKING not)."""
    found: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.If) and _is_type_checking(stmt):
            continue
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            nested = [*stmt.body, *getattr(stmt, "orelse", []), *getattr(stmt, "finalbody", [])]
            nested += [s for h in getattr(stmt, "handlers", []) for s in h.body]
            found += _top_level(nested)
        else:
            found.append(stmt)
    return found


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """The clouseau modules ``path`` imports (``from a import b`` counts ``a`` and ``a.b``)."""
    module, tree = _module_name(path), ast.parse(path.read_text(), str(path))
    nodes = _top_level(tree.body) if top_level_only else list(ast.walk(tree))
    found = set().union(*(_import_targets(module, path.name == "__init__.py", n) for n in nodes))
    return {name for name in found if name == "clouseau" or name.startswith("clouseau.")}


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        ("clouseau.ir", ("clouseau.capture", "clouseau.store", "clouseau.exporters")),
        (
            "clouseau.capture",
            ("clouseau.exporters", "clouseau.store", "clouseau.distributed", "clouseau.dataset"),
        ),
        ("clouseau.store", ("clouseau.capture", "clouseau.exporters")),
        ("clouseau.exporters", ("clouseau.capture",)),
    ],
)
def test_layers_import_only_downwards(importer: str, forbidden: tuple[str, ...]) -> None:
    offences = [
        f"{module} imports {target}"
        for module, path in MODULES.items()
        if _in(module, importer)
        for target in sorted(_imports(path, top_level_only=False))
        if any(_in(target, package) for package in forbidden)
    ]
    assert not offences, "\n".join(offences)


def test_no_module_level_import_cycle() -> None:
    top = {
        module: {target for target in _imports(path, True) if target in MODULES} - {module}
        for module, path in MODULES.items()
    }
    # A package's __init__ importing its own submodules is how packages are built; a cycle
    # through two sibling modules (a imports b, b imports a, both at import time) is not.
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(top[module]):
            if _in(module, target):  # a submodule importing its own package's __init__
                continue
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :]
                if not all(_in(m, cycle[0]) or _in(cycle[0], m) for m in cycle):
                    cycles.append([*cycle, target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in MODULES:
        if module not in state:
            visit(module)
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize(
    "literal",
    [
        '"clouseau.capture/1"',
        '"clouseau.graph"',
        '"clouseau.record/1"',
        '"status.json"',
        '"record.json"',
        '".clouseau.lock"',
        '"graph-{:03d}.json"',
        '"activations-{idx:03d}.safetensors"',
    ],
)
def test_each_name_of_the_capture_layout_is_spelled_once(literal: str) -> None:
    # The format markers and file names live in store/layout.py (the graph's marker in
    # ir/serialize.py, which the IR owns): a second spelling would drift from the first.
    found = sorted(m for m, path in MODULES.items() if literal in path.read_text())
    assert len(found) == 1 and found[0] in ("clouseau.store.layout", "clouseau.ir.serialize"), (
        f"{literal} is spelled in {found}: import it from clouseau.store.layout"
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_within_line_budget(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (budget {MAX_LINES}): split it"
