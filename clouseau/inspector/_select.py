"""How :func:`clouseau.inspector.tail` turns the seed's tree filters into an IR selection.

The seed chose modules by walking the model tree with ``filter_(path, node)`` and
``is_leaf(path, node)``; the compiler chooses IR points. :func:`chosen_modules` walks the
tree once (``path`` is a tuple of strings in both frameworks), and :class:`ModuleOutputs`
is the ``select`` callable that picks the points that are the outputs of those modules,
remembering the legacy key of each point (``<module path>.__call__``). The keys are kept
beside the capture in ``inspector.json`` so that :func:`read_sidecar` can map a file's
point names back to legacy keys without the model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import Graph, NodeKind, Point, Ref, TensorSpec
from clouseau.ir.selection import Selector

TreePath = tuple[str, ...]
NodeTest = Callable[[TreePath, Any], bool]
Children = Callable[[Any], Iterator[tuple[str, Any]]]

CALL = "__call__"
SIDECAR = "inspector.json"
SIDECAR_FORMAT = "clouseau.inspector/1"
ROOT = ""

_OUTPUT = re.compile(r"^(.*):([0-9]+)$")  # "attn:1": output 1 of a multi-output module
_REPEAT = re.compile(r"^(.*)_([0-9]+)$")  # "block_1": the second call in one forward


def chosen_modules(
    model: Any, children: Children, filter_: NodeTest, is_leaf: NodeTest
) -> tuple[str, ...]:
    """The dotted paths of the tree nodes that ``filter_`` chooses ("" is the root).

    Every node is offered to ``filter_``; ``is_leaf`` stops the descent below a node (the
    node itself is still offered). The root's path is ``()``: a test that indexes
    ``path[-1]`` raises IndexError there, which we read as "no" rather than as an error,
    so the seed's documented ``lambda path, node: "linear" in path[-1]`` works.
    """
    chosen: list[str] = []

    def visit(path: TreePath, node: Any) -> None:
        if _ask(filter_, path, node):
            chosen.append(".".join(path))
        if _ask(is_leaf, path, node):
            return
        for name, child in children(node):
            visit((*path, name), child)

    visit((), model)
    return tuple(dict.fromkeys(chosen))


def _ask(test: NodeTest, path: TreePath, node: Any) -> bool:
    try:
        return bool(test(path, node))
    except IndexError:
        if path:
            raise
        return False


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity (the dicts are not hashable)
class ModuleOutputs:
    """The ``select`` of a tail: the outputs of the chosen modules (bound per graph).

    ``keys`` fills in as graphs are selected (one per input signature): point name ->
    the legacy keys of that value (a value can be the output of several modules, e.g. a
    block that returns its last layer's output). The dict is mutable on purpose: the
    frontend binds us lazily (``for_graph``), at the first call of each signature.
    """

    modules: frozenset[str]
    keys: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def for_graph(self, graph: Graph) -> Selector:
        """The selection for one traced graph: the points that chosen modules output."""
        plan = plan_keys(graph, self.modules)
        for name, keys in plan.items():
            self.keys[name] = tuple(dict.fromkeys((*self.keys.get(name, ()), *keys)))
        names = frozenset(plan)
        return Selector(lambda p: p.name in names, "inspector.tail module outputs")


def plan_keys(graph: Graph, modules: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """Point name -> legacy keys for every point of ``graph`` that a chosen module outputs."""
    keys: dict[str, list[str]] = {}
    for point in graph.points:
        key = module_key(point, modules)
        if key:
            keys.setdefault(point.name, []).append(key)
    if ROOT in modules:
        for name, key in _root_keys(graph):
            keys.setdefault(name, []).append(key)
    if not keys and modules:
        shown = ", ".join(repr(m) for m in sorted(modules)[:8])
        raise SelectionError(
            f"inspector.tail: filter_ chose {len(modules)} node(s) of the model tree ({shown}) "
            f"but none of them returns an array when {graph.name or 'the model'} runs (a plain "
            "function stored in a field, or a submodule that is never called, has no output to "
            "record). Check filter_, or list the points with clouseau.trace(model, *args).names()."
        )
    return {name: tuple(dict.fromkeys(k)) for name, k in keys.items()}


def module_key(point: Point, modules: frozenset[str]) -> str | None:
    """``<name>.__call__[:i]`` if ``point`` is the output of a chosen module, else None.

    A module output is an alias (``layer1``; ``layer1_1`` for the second call in one
    forward; ``attn:0`` for output 0 of several), or, for a PyTorch built-in (leaf)
    module, the call node itself, named by the module path (``layer1.0.conv1``).
    """
    stem, output = point.name, ""
    match = _OUTPUT.match(stem)
    if match:
        stem, output = match.group(1), f":{match.group(2)}"
    if not point.is_alias:
        node = point.node
        if (
            node.kind is not NodeKind.OP
            or not node.module
            or _module_of(stem, frozenset((node.module,))) is None
        ):
            return None
    if _module_of(stem, modules) is None:
        return None
    return f"{stem}.{CALL}{output}"


def _module_of(stem: str, modules: frozenset[str]) -> str | None:
    if stem in modules:
        return stem
    match = _REPEAT.match(stem)
    return match.group(1) if match and match.group(1) in modules else None


def _root_keys(graph: Graph) -> list[tuple[str, str]]:
    """(point name, key) of the model's own output: ``__call__``, or ``__call__:i``."""
    output = graph.output
    if output is None:
        return []
    by_ref: dict[Ref, str] = {}
    for point in graph.points:
        by_ref.setdefault(point.ref, point.name)
    refs = [r for r in dict.fromkeys(output.inputs) if r in by_ref and _is_tensor(graph, r)]
    if len(refs) == 1:
        return [(by_ref[refs[0]], CALL)]
    return [(by_ref[r], f"{CALL}:{i}") for i, r in enumerate(refs)]


def _is_tensor(graph: Graph, ref: Ref) -> bool:
    return isinstance(graph.node(ref.node).outputs[ref.index], TensorSpec)


def legacy_depth(key: str) -> int:
    """How deep the module of a legacy key sits (the root is 0): inner modules come first."""
    return key.split(CALL, 1)[0].count(".")


# -- inspector.json: point name -> legacy keys, kept beside the capture ------------------


def write_sidecar(directory: Path, keys: Mapping[str, tuple[str, ...]]) -> None:
    """Write ``inspector.json`` atomically, tied to the capture's graphs by their digests."""
    data = {
        "format": SIDECAR_FORMAT,
        "graphs": _graph_digests(directory),
        "keys": {k: list(v) for k, v in keys.items()},
    }
    tmp = directory / f".{SIDECAR}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, directory / SIDECAR)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_sidecar(directory: Path) -> None:
    """Forget the legacy keys of an earlier tail in ``directory`` (its capture is replaced)."""
    (directory / SIDECAR).unlink(missing_ok=True)


def read_sidecar(directory: Path) -> dict[str, tuple[str, ...]] | None:
    """The legacy keys of a tail capture in ``directory``; None if there is none.

    A sidecar whose graphs differ from the directory's (a later, plain ``instrument``
    capture replaced the tail's) is ignored, so stale keys are never shown.
    """
    try:
        data = json.loads((directory / SIDECAR).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
        return None
    if data.get("graphs") != _graph_digests(directory):
        return None
    keys = data.get("keys")
    if not isinstance(keys, dict):
        return None
    return {str(k): tuple(map(str, v)) for k, v in keys.items() if isinstance(v, list)}


def _graph_digests(directory: Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(directory.glob("graph-*.json"))
    }
