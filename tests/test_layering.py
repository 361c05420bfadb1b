"""The package's layering as an allow-list, read from its source (docs/architecture.md).

:data:`LAYERS` says, for each package (or top-level module) of ``clouseau``, which other
ones it MAY import; anything else is an offence, and a module that no layer holds fails
until it is given one. On top of the list: a private module (``_name``) is imported only
from inside the package that holds it, so ``clouseau.capture`` (the ``Frontend`` protocol)
is the one door into a frontend. Also here: no module-level import cycle, the capture
directory's names spelled once (in ``store/layout.py``), modules within the line budget.
Only module-level imports count for cycles (an import inside a function is the documented
way to defer a framework); every import counts for the allow-list.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clouseau"
MAX_LINES = 500


@dataclass(frozen=True)
class Layer:
    """A package or top-level module and the layers its modules may import."""

    name: str
    may_import: tuple[str, ...]
    why: str


# Bottom up. A layer may always import itself; the names are layers, not prefixes:
# ``clouseau.capture`` is the door and what the frontends share, never a frontend.
LAYERS = (
    Layer("clouseau.ir", (), "the shared core: imports no other layer"),
    Layer("clouseau.store", ("clouseau.ir",), "knows no frontend, exporter or API"),
    Layer("clouseau.capture", ("clouseau.ir",), "the Frontend protocol and what frontends share"),
    Layer("clouseau.capture.torch", ("clouseau.ir", "clouseau.capture"), "a frontend"),
    Layer("clouseau.capture.jax", ("clouseau.ir", "clouseau.capture"), "a frontend"),
    Layer("clouseau.exporters", ("clouseau.ir", "clouseau.store"), "never a frontend"),
    Layer(
        "clouseau.dataset",
        ("clouseau.ir", "clouseau.store", "clouseau.capture", "clouseau.distributed"),
        "record(): a frontend through the door, rows in the store, parts per process",
    ),
    Layer(
        "clouseau.distributed",
        ("clouseau.ir", "clouseau.store", "clouseau.capture", "clouseau.dataset"),
        "torchrun, JAX processes and Ray over the store and the dataset recorder",
    ),
    Layer("clouseau._explore", ("clouseau.ir", "clouseau.store", "clouseau.exporters"), "HTML"),
    Layer(
        "clouseau.api",
        (
            "clouseau.ir",
            "clouseau.store",
            "clouseau.capture",
            "clouseau.exporters",
            "clouseau.dataset",
            "clouseau.distributed",
            "clouseau._explore",
        ),
        "the public functions: a lowered model handed from a frontend to an exporter",
    ),
    Layer(
        "clouseau.cli",
        ("clouseau.ir", "clouseau.store", "clouseau.api", "clouseau._explore"),
        "the clouseau command",
    ),
    Layer(
        "clouseau.inspector",
        ("clouseau", "clouseau.ir", "clouseau.store", "clouseau.capture"),
        "the seed's API on top of clouseau.instrument",
    ),
    Layer("clouseau.magnifier", ("clouseau.inspector",), "the seed's import path"),
    Layer(
        "clouseau",
        ("clouseau.api", "clouseau.dataset", "clouseau.ir", "clouseau.store"),
        "__init__: the public names",
    ),
)

# Imports the list forbids that are still in the code, each to be removed by the change
# named beside it. The coordinator empties this: an entry that no longer occurs fails
# test_known_layering_offences_still_occur, so that the list never outlives its offence.
KNOWN_OFFENCES: frozenset[tuple[str, str]] = frozenset()


# The torch frontend's groups, bottom up (docs/architecture.md, capture/torch/README.md):
# a module of a group may import its own group and those before it, never one after. The
# shared helpers at the top of the package import no group; the entry points (the
# package's __init__ and module.py, the instrumented model that picks a tier per call)
# may import every group.
TORCH = "clouseau.capture.torch"
TORCH_SHARED = ("_compat", "_quiet", "_sync", "flop_ops")
TORCH_GROUPS = ("naming", "tracing", "lowering", "runtime", "dynamic")
TORCH_ENTRY = ("", "module")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


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
    """The modules an import statement imports (``from a import b``: ``a.b`` if a module)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom):
        source = _resolve(module, is_package, node)
        names = {f"{source}.{alias.name}" for alias in node.names}
        return {name if name in MODULES else source for name in names}
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
    """The clouseau modules ``path`` imports."""
    module, tree = _module_name(path), ast.parse(path.read_text(), str(path))
    nodes = _top_level(tree.body) if top_level_only else list(ast.walk(tree))
    found = set().union(*(_import_targets(module, path.name == "__init__.py", n) for n in nodes))
    return {name for name in found if name == "clouseau" or name.startswith("clouseau.")}


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def layer_of(module: str) -> Layer | None:
    """The most specific layer holding ``module`` (the root layer holds ``clouseau`` alone)."""
    holding = [
        layer
        for layer in LAYERS
        if (module == layer.name if layer.name == "clouseau" else _in(module, layer.name))
    ]
    return max(holding, key=lambda layer: len(layer.name), default=None)


def _private_outsider(importer: str, target: str) -> bool:
    """Whether ``target`` has a private part (``_name``) whose package ``importer`` is outside."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return not _in(importer, ".".join(parts[:i]))
    return False


def _offences() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for module, path in MODULES.items():
        layer = layer_of(module)
        assert layer is not None
        for target in _imports(path, top_level_only=False):
            home = layer_of(target)
            allowed = home is layer or (home is not None and home.name in layer.may_import)
            if not allowed or _private_outsider(module, target):
                found.add((module, target))
    return found


def test_every_module_is_in_a_layer() -> None:
    homeless = sorted(m for m in MODULES if layer_of(m) is None)
    assert not homeless, f"{homeless} are in no layer of LAYERS: add one (what may they import?)"


def test_layers_import_only_what_the_allow_list_says() -> None:
    offences = sorted(_offences() - KNOWN_OFFENCES)
    lines = [
        f"{m} imports {t}: {layer_of(m).name} may import "  # type: ignore[union-attr]
        f"{', '.join(layer_of(m).may_import) or 'nothing else'}, "  # type: ignore[union-attr]
        "and a private module only from inside its package"
        for m, t in offences
    ]
    assert not lines, "\n".join(lines)


def test_known_layering_offences_still_occur() -> None:
    stale = sorted(KNOWN_OFFENCES - _offences())
    assert not stale, f"{stale} no longer occur: remove them from KNOWN_OFFENCES"


@pytest.mark.parametrize(
    ("importer", "target", "allowed"),
    [
        ("clouseau.store.writer", "clouseau.ir.graph", True),
        ("clouseau.store.writer", "clouseau.capture", False),
        ("clouseau.ir.graph", "clouseau.api", False),
        ("clouseau.ir.graph", "clouseau.ir.tables", True),
        ("clouseau.capture.torch.lowering.lower", "clouseau.capture._common", True),
        ("clouseau.capture.torch.lowering.lower", "clouseau.capture.jax.naming", False),
        ("clouseau.api", "clouseau.capture", True),
        ("clouseau.api", "clouseau.capture.torch.dynamic.backend", False),
        ("clouseau.distributed._jax", "clouseau.capture.jax._compat", False),
        ("clouseau.dataset.recorder", "clouseau.capture._common", False),
        ("clouseau.exporters.onnx", "clouseau.capture", False),
        ("clouseau.cli.show", "clouseau.cli.args", True),
    ],
)
def test_the_allow_list_reads_as_documented(importer: str, target: str, allowed: bool) -> None:
    layer, home = layer_of(importer), layer_of(target)
    assert layer is not None and home is not None
    ok = (home is layer or home.name in layer.may_import) and not _private_outsider(
        importer, target
    )
    assert ok is allowed


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


def torch_rank(module: str) -> int:
    """Where a module of the torch frontend sits in its group order (higher imports lower)."""
    rest = module.removeprefix(TORCH).removeprefix(".")
    head = rest.split(".", 1)[0]
    if head in TORCH_SHARED:
        return 0
    if head in TORCH_GROUPS:
        return 1 + TORCH_GROUPS.index(head)
    assert rest in TORCH_ENTRY, f"{module} is in no group of the torch frontend: give it one"
    return 1 + len(TORCH_GROUPS)


def _torch_back_edges() -> list[str]:
    found = []
    for module, path in MODULES.items():
        if not _in(module, TORCH):
            continue
        for target in sorted(_imports(path, top_level_only=False)):
            if _in(target, TORCH) and torch_rank(target) > torch_rank(module):
                found.append(f"{module} imports {target}")
    return found


def test_the_torch_groups_import_only_groups_before_them() -> None:
    edges = _torch_back_edges()
    assert not edges, (
        f"the torch frontend's groups are layered {' <- '.join(TORCH_GROUPS)} (shared "
        "helpers below, __init__ and module.py above); these import a later group (move "
        "the function to the lower group):\n" + "\n".join(edges)
    )


@pytest.mark.parametrize(
    ("importer", "target", "allowed"),
    [
        ("tracing.fx", "naming.points", True),
        ("lowering.lower", "tracing.ir_build", True),
        ("tracing.ir_build", "lowering.computed", False),
        ("naming.points", "tracing.traced", False),
        ("tracing.export", "runtime.tiers", False),
        ("dynamic.dynamo", "runtime.hooks", True),
        ("runtime.hooks", "dynamic.dynamo", False),
        ("module", "dynamic.dynamo", True),
        ("_compat", "naming.points", False),
        ("runtime.tiers", "module", False),
    ],
)
def test_the_torch_group_order_reads_as_documented(
    importer: str, target: str, allowed: bool
) -> None:
    assert (torch_rank(f"{TORCH}.{target}") <= torch_rank(f"{TORCH}.{importer}")) is allowed


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


def _documented_layers() -> dict[str, tuple[str, ...]]:
    """The table of docs/architecture.md's "Layers" section: layer -> what it may import."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| ([^|]*) \|", section, re.MULTILINE)
    return {name: tuple(re.findall(r"`([\w.]+)`", imports)) for name, imports in rows}


def test_the_architecture_page_states_the_allow_list() -> None:
    documented = _documented_layers()
    assert documented == {layer.name: layer.may_import for layer in LAYERS}
