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
graph is recorded per distinct sequence of names, ranks and dtypes, with the sizes of its
first call (a new sequence length is no new graph); the files keep each array's shape.
"""

from __future__ import annotations

import fnmatch
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from clouseau.capture.torch.host import to_numpy
from clouseau.capture.torch.names import PointNamer, element_paths
from clouseau.capture.torch.naming import spec_of
from clouseau.ir.graph import Graph, ModuleInfo, Node, NodeKind, OpaqueSpec, Ref, TraceKind
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


# One module output met in a call: (raw path, module type, [(suffix, value index,
# (shape, dtype))]); the values, copied to the host, are listed once per call.
_Met = tuple[str, str, list[tuple[str, int, Any]]]
_DEFERRED = -1  # a first call not begun in the sink yet


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
        # Per kind of call: its graph id and, per saved value, (index, node, names).
        self._graphs: dict[Any, tuple[int, tuple[tuple[int, str, tuple[str, ...]], ...]]] = {}
        self._names: dict[tuple[str, ...], list[str]] = {}
        self._met: list[_Met] = []
        self._values: list[Any] = []
        self._seen: dict[Any, int] = {}
        self._call: int | None = None
        self._begun = False  # whether a call has begun in the sink
        self._root: torch.nn.Module | None = None
        # One hooked run at a time; the hooks ignore other threads (which may run the
        # model itself meanwhile).
        self._lock = threading.Lock()
        self._thread: int | None = None

    def run(self, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One call of ``model``, its selected module outputs saved as one call."""
        with self.installed((model,)):
            return model(*args, **kwargs)

    @contextmanager
    def installed(self, roots: Sequence[torch.nn.Module]) -> Iterator[None]:
        """Hooks on the roots (call boundaries) and the selected modules while it runs."""
        with self._lock:
            self._thread = threading.get_ident()
            try:
                with self._hooked(roots):
                    yield
            finally:
                self._thread = None

    @contextmanager
    def _hooked(self, roots: Sequence[torch.nn.Module]) -> Iterator[None]:
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
                if self._call != _DEFERRED:
                    self._sink.fail_call(self._call, error)
                self._call = self._root = None
            raise
        finally:
            for handle in handles:
                handle.remove()

    def _begin(self, module: torch.nn.Module, args: Any) -> None:
        if self._call is None and threading.get_ident() == self._thread:
            self._met, self._values, self._seen = [], [], {}
            self._root = module
            # The first call begins in the sink (which replaces an earlier capture at its
            # path) only at its first selected output: a rerun that fails before, on a
            # wrong input, leaves the earlier capture whole.
            self._call = self._sink.begin_call() if self._begun else _DEFERRED

    def _begin_deferred(self) -> int:
        if self._call == _DEFERRED:
            self._call, self._begun = self._sink.begin_call(), True
        return self._call  # type: ignore[return-value]

    def _record(self, path: str, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._call is None or threading.get_ident() != self._thread:
            return
        self._begin_deferred()
        elements = [
            (s, self._value(v), (v.shape, v.dtype))
            for s, v in element_paths(out)
            if isinstance(v, torch.Tensor)
        ]
        if elements:
            self._met.append((path, type(module).__name__, elements))

    def _value(self, t: torch.Tensor) -> int:
        """The index of ``t``'s value in this call, copied to the host on first sight.

        A tensor two modules return unchanged (a block's output that is its last ReLU's,
        ``nn.Identity``) is one value, saved once with all its names, as in the traced
        tiers; a later in-place op bumps its version and makes another value.
        """
        ident = (t.data_ptr(), t._version, t.shape, t.stride(), t.dtype, t.device)
        found = self._seen.get(ident)
        if found is None:
            # Copied now: a later in-place op (ReLU(inplace=True)) must not change it.
            found = self._seen[ident] = len(self._values)
            # The tensor itself too, till the call ends: its memory is not reused by
            # another tensor meanwhile, which would take its identity.
            self._values.append((to_numpy(t), t))
        return found

    def _end(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if module is not self._root or self._call is None or threading.get_ident() != self._thread:
            return
        call, self._call, self._root = self._begin_deferred(), None, None
        try:
            graph_id, saves = self._graph(self._met)
            values = [
                SavedValue(names, node, self._values[index][0]) for index, node, names in saves
            ]
            self._sink.put(call, graph_id, values)
        except BaseException as error:
            self._sink.fail_call(call, error)
            raise
        finally:
            self._met, self._values, self._seen = [], [], {}
        self._sink.end_call(call)

    def _call_names(self, met: list[_Met]) -> list[str]:
        """The point name of each module call (``<path>``, then ``<path>_<k>``)."""
        key = tuple(path for path, _, _ in met)
        found = self._names.get(key)
        if found is None:
            if len(self._names) >= 4096:  # unbounded kinds of calls: start over
                self._names.clear()
            namer = PointNamer(self._model)
            found = self._names[key] = [namer.module_output(path) for path in key]
        return found

    def _graph(self, met: list[_Met]) -> tuple[int, tuple[tuple[int, str, tuple[str, ...]], ...]]:
        """The graph id of this sequence of outputs; per saved value, its index in the
        call, its node and its selected names."""
        names = self._call_names(met)
        # Ranks, not sizes: a new length is no new graph (it shows the first call's sizes;
        # the files keep each array's own).
        key = (
            tuple(names),
            tuple((s, i, len(shape), dtype) for _, _, els in met for s, i, (shape, dtype) in els),
        )
        found = self._graphs.get(key)
        if found is None:
            values = _values(names, met)
            graph = insert_saves(self._module_graph(values), self._select, strict=False)
            chosen = {p.name for p in select_points(graph, self._select, strict=False)}
            saves = tuple(
                (index, value_names[0], picked)
                for index, (value_names, _, _, _) in values.items()
                for picked in [tuple(n for n in value_names if n in chosen)]
                if picked
            )
            found = self._graphs[key] = (self._sink.add_graph(graph), saves)
        return found

    def _module_graph(self, values: dict[int, tuple[list[str], str, str, Any]]) -> Graph:
        # The inputs as one opaque value: module outputs are the points of this path.
        nodes = [Node("input", NodeKind.INPUT, "input", outputs=(OpaqueSpec("inputs"),))]
        namer = PointNamer(self._model)
        for value_names, path, kind, (shape, dtype) in values.values():
            nodes.append(
                Node(
                    name=value_names[0],
                    kind=NodeKind.OP,
                    op=kind.lower(),
                    inputs=(Ref("input"),),
                    outputs=(spec_of(torch.empty(shape, dtype=dtype, device="meta")),),
                    module=namer.path(path),
                    module_type=kind,
                    aliases=tuple((0, n) for n in value_names[1:]),
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
                trace_kind=TraceKind.TORCH_HOOKS,
                modules=modules,
                meta=(("training", self._model.training), ("tier", "hooks")),
            )
        )


def _values(names: list[str], met: list[_Met]) -> dict[int, tuple[list[str], str, str, Any]]:
    """Per value of the call, in order of first sight: every name it has, and the module
    path, type and (shape, dtype) of its first producer."""
    values: dict[int, tuple[list[str], str, str, Any]] = {}
    for name, (path, kind, els) in zip(names, met, strict=True):
        for position, (suffix, index, spec) in enumerate(els):
            value = values.setdefault(index, ([], path, kind, spec))
            fresh = _element_names(name, suffix, position == 0)
            value[0].extend(n for n in fresh if n not in value[0])
    return values


def _element_names(name: str, suffix: str, first: bool) -> tuple[str, ...]:
    """As the traced tiers: ``<name>`` and ``<name><suffix>`` for the first tensor
    element of a call's output, ``<name><suffix>`` for the others."""
    if not suffix:
        return (name,)
    return (name, name + suffix) if first else (name + suffix,)


def hook_capture(
    model: torch.nn.Module, select: SelectLike, sink: Sink, plain: bool
) -> HookCapture | None:
    """The capture through forward hooks, or None when it cannot serve the call.

    ``plain``: no interventions and no gradients, which need the traced graph.
    """
    paths = module_paths_selected(model, select) if plain else None
    return HookCapture(model, select, sink, paths) if paths else None
