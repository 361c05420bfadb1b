"""Module outputs through forward hooks, with no trace: the fast path of ``generate``.

When every point a selection can pick is a module's output, the points are known from
``named_modules()`` without a trace, and forward hooks capture them at the cost of a copy.
A ``torch.export`` of a decoder costs a second or more, about the whole of a short
generation, so ``fmodel.generate`` takes this path for such selections. The names are the
traced tiers' (:mod:`names`): ``<path>`` for a module's first call in a model call,
``<path>_<k>`` for later ones, ``<path>:<i>`` (or ``:<key>``) for the elements of a tuple,
list, dict or ``ModelOutput``, the first tensor element also named ``<path>``. Each value
is copied to the host inside its hook, so a later in-place op cannot change it.

The graph a capture stores for these calls is a module-level one (frontend
``torch.hooks``): an opaque input, one node per module output met, with its shape. One
graph is recorded per distinct sequence of names and shapes (a prefill, the decode steps).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from clouseau.capture.torch.host import to_numpy
from clouseau.capture.torch.names import PointNamer, element_paths
from clouseau.capture.torch.naming import spec_of
from clouseau.ir.graph import Frontend, Graph, ModuleInfo, Node, NodeKind, OpaqueSpec, Ref
from clouseau.ir.passes import insert_saves
from clouseau.ir.selection import SelectLike, select_points
from clouseau.ir.sink import SavedValue, Sink
from clouseau.ir.verify import verify

_WILD = re.compile(r"[*?\[]")
_REPEAT = re.compile(r"_[0-9]+$")


def module_paths_selected(model: torch.nn.Module, select: SelectLike) -> tuple[str, ...] | None:
    """The module paths whose outputs ``select`` may pick, or None if it may pick others.

    Only globs are judged (a callable or a Selector may pick anything): each positive glob
    must have a dot (a dotless glob also matches op names, ``"relu*"``), a last component
    without wildcards, and name a module of ``model`` once a ``:<element>`` and a ``_<k>``
    repeat suffix are set aside. An op is named ``<module path>.<op>`` and a module path
    is never an op's name, so such a glob matches module outputs only; a glob with
    wildcards could also reach ``<other path>.<op>``, so its last component must not be
    the name of a torch function or operator (``"blocks.*.relu"`` is traced).
    """
    if isinstance(select, str):
        select = (select,)
    if not isinstance(select, Sequence) or not all(isinstance(s, str) for s in select):
        return None
    positive = [s for s in select if not s.startswith("!")]
    if not positive:
        return None
    paths = [p for p, _ in model.named_modules() if p]
    found: dict[str, None] = {}
    for glob in positive:
        base = glob.split(":", 1)[0]
        last = base.rsplit(".", 1)[-1]
        if "." not in base or _WILD.search(last):
            return None
        if _WILD.search(base) and _is_op_name(_REPEAT.sub("", last)):
            return None
        stripped = _REPEAT.sub("", base)
        hits = [
            p for p in paths if fnmatch.fnmatchcase(p, base) or fnmatch.fnmatchcase(p, stripped)
        ]
        if not hits:
            return None
        found.update(dict.fromkeys(hits))
    return tuple(found)


def _is_op_name(name: str) -> bool:
    import builtins
    import operator

    import torch.nn.functional as F

    spaces = (torch, F, torch.Tensor, torch.ops.aten, operator, builtins)
    return any(hasattr(space, name) or hasattr(space, name + "_") for space in spaces)


# One module output met in a call: (raw path, module type, [(suffix, host array,
# (shape, dtype))]).
_Met = tuple[str, str, list[tuple[str, Any, Any]]]


class HookCapture:
    """Saves the selected module outputs of every call of ``model``'s roots into ``sink``.

    A *root* call (``model`` itself, or a T5 encoder run on its own by ``generate``) that
    starts while no call is open is one call of the capture.
    """

    def __init__(
        self, model: torch.nn.Module, select: SelectLike, sink: Sink, paths: tuple[str, ...]
    ) -> None:
        self._model = model
        self._select = select
        self._sink = sink
        self._paths = paths
        self._graphs: dict[Any, tuple[int, tuple[tuple[str, ...], ...]]] = {}
        self._names: dict[tuple[str, ...], list[str]] = {}
        self._met: list[_Met] = []
        self._call: int | None = None
        self._root: torch.nn.Module | None = None

    @contextmanager
    def installed(self, roots: Sequence[torch.nn.Module]) -> Iterator[None]:
        """Hooks on the roots (call boundaries) and the selected modules while it runs."""
        handles = []
        modules = dict(self._model.named_modules())
        for path in self._paths:
            module = modules[path]
            handles.append(module.register_forward_hook(partial(self._record, path)))
        for root in roots:
            handles.append(root.register_forward_pre_hook(self._begin))
            handles.append(root.register_forward_hook(self._end))
        try:
            yield
        except BaseException as error:
            if self._call is not None:  # the model failed inside a call
                self._sink.fail_call(self._call, error)
                self._call = self._root = None
            raise
        finally:
            for handle in handles:
                handle.remove()

    def _begin(self, module: torch.nn.Module, args: Any) -> None:
        if self._call is None:
            self._met = []
            self._root = module
            self._call = self._sink.begin_call()

    def _record(self, path: str, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._call is None:
            return
        # Copied now: a later in-place op (ReLU(inplace=True)) must not change it.
        elements = [
            (s, to_numpy(v), (v.shape, v.dtype))
            for s, v in element_paths(out)
            if isinstance(v, torch.Tensor)
        ]
        if elements:
            self._met.append((path, type(module).__name__, elements))

    def _end(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if module is not self._root or self._call is None:
            return
        call, self._call, self._root = self._call, None, None
        try:
            graph_id, saves = self._graph(self._met)
            values = [
                SavedValue(names, names[0], array)
                for names, (_, array, _) in zip(saves, _elements(self._met), strict=True)
                if names
            ]
            self._sink.put(call, graph_id, values)
        except BaseException as error:
            self._sink.fail_call(call, error)
            raise
        finally:
            self._met = []
        self._sink.end_call(call)

    def _call_names(self, met: list[_Met]) -> list[str]:
        """The point name of each module call (``<path>``, then ``<path>_<k>``)."""
        key = tuple(path for path, _, _ in met)
        found = self._names.get(key)
        if found is None:
            namer = PointNamer(self._model)
            found = self._names[key] = [namer.module_output(path) for path in key]
        return found

    def _graph(self, met: list[_Met]) -> tuple[int, tuple[tuple[str, ...], ...]]:
        """The graph id of this sequence of outputs, and the selected names of each element."""
        names = self._call_names(met)
        key = (
            tuple(names),
            tuple((s, spec) for _, _, els in met for s, _, spec in els),
        )
        found = self._graphs.get(key)
        if found is None:
            graph = insert_saves(self._module_graph(names, met), self._select, strict=False)
            chosen = {p.name for p in select_points(graph, self._select, strict=False)}
            saves = tuple(
                tuple(n for n in _element_names(name, s, first) if n in chosen)
                for name, (_, _, els) in zip(names, met, strict=True)
                for first, (s, _, _) in _firsts(els)
            )
            found = self._graphs[key] = (self._sink.add_graph(graph), saves)
        return found

    def _module_graph(self, names: list[str], met: list[_Met]) -> Graph:
        # The inputs as one opaque value: module outputs are the points of this path.
        nodes = [Node("input", NodeKind.INPUT, "input", outputs=(OpaqueSpec("inputs"),))]
        namer = PointNamer(self._model)
        for name, (path, kind, els) in zip(names, met, strict=True):
            for first, (suffix, _, spec) in _firsts(els):
                node_names = _element_names(name, suffix, first)
                nodes.append(
                    Node(
                        name=node_names[0],
                        kind=NodeKind.OP,
                        op=kind.lower(),
                        inputs=(Ref("input"),),
                        outputs=(spec_of(torch.empty(spec[0], dtype=spec[1], device="meta")),),
                        module=namer.path(path),
                        module_type=kind,
                        aliases=tuple((0, n) for n in node_names[1:]),
                        attrs=(("module_output", True),),
                    )
                )
        nodes.append(Node("output", NodeKind.OUTPUT, "output"))
        modules = tuple(
            ModuleInfo(path, type(m).__name__, sum(p.numel() for p in m.parameters()))
            for path, m in self._model.named_modules()
        )
        return verify(
            Graph(
                nodes=tuple(nodes),
                name=type(self._model).__name__,
                frontend=Frontend.TORCH_HOOKS,
                modules=modules,
                meta=(("training", self._model.training), ("tier", "hooks")),
            )
        )


def _firsts(
    elements: list[tuple[str, Any, Any]],
) -> Iterator[tuple[bool, tuple[str, Any, Any]]]:
    for i, element in enumerate(elements):
        yield i == 0, element


def _element_names(name: str, suffix: str, first: bool) -> tuple[str, ...]:
    """As the traced tiers: ``<name>`` and ``<name><suffix>`` for the first tensor
    element of a call's output, ``<name><suffix>`` for the others."""
    if not suffix:
        return (name,)
    return (name, name + suffix) if first else (name + suffix,)


def _elements(met: list[_Met]) -> Iterator[tuple[str, Any, Any]]:
    for _, _, els in met:
        yield from els
