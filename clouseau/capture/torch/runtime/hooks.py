"""Module outputs through forward hooks: the one implementation, wherever Python runs a
module's ``forward``.

:class:`ModuleHooks` saves module outputs on every path that runs the model's own Python:
the *hook path* (a selection of module outputs only, no trace: :func:`hook_capture`),
``fmodel.generate`` on that path, the *dynamic tier* (TorchDynamo regions, where the hooks
run eagerly between regions, so a frame Dynamo skips or a loop that runs a different
number of times loses nothing) and the *hook tier* (Dynamo failed). The names are the
traced tiers' (:mod:`naming.points`): ``<path>`` for a module's first call in a model call,
``<path>_<k>`` for later ones (:class:`~clouseau.capture.torch.naming.points.PointNamer`'s
counter), ``<path>:<i>`` (or ``:<key>``) for the elements of a tuple, list, dict or
``ModelOutput``, the first tensor element also named ``<path>``
(:func:`~clouseau.capture.torch.naming.points.element_names`). Each value is copied to the host
inside its hook, once, so a later in-place op cannot change it.

Cost: the hooks are registered once per instrumented model, at its first call, and stay
(a weak reference: they go with the instrumented model); outside one of its calls, in
another thread, or on a copy of the model, a hook returns at once. A call keeps only its
own values; the names and the graph of a sequence of module calls are computed once. The
sink hears of a call once, at its end (:func:`~clouseau.ir.sink.whole_call`).

The graph a capture stores for these calls is a module-level one (frontend
``torch.hooks``): an opaque input, one node per module output met, with its shape. One
graph is recorded per distinct sequence of names, ranks and dtypes, with the sizes of its
first call (a new sequence length is no new graph); the files keep each array's shape.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from threading import get_ident
from typing import Any

import torch

from clouseau.capture.torch._compat import module_dispatches, tensor_version
from clouseau.capture.torch.flop_ops import category
from clouseau.capture.torch.naming.points import (
    PointNamer,
    element_names,
    element_paths,
    free_name,
)
from clouseau.capture.torch.runtime.hook_selection import hooked_paths, module_paths_selected
from clouseau.capture.torch.runtime.host import to_numpy
from clouseau.capture.torch.tracing.specs import spec_of
from clouseau.ir.errors import CaptureError
from clouseau.ir.flops import category_attr
from clouseau.ir.graph import Graph, ModuleInfo, Node, NodeKind, OpaqueSpec, Ref, TraceKind
from clouseau.ir.passes import insert_saves
from clouseau.ir.selection import SelectLike, select_points
from clouseau.ir.sink import SavedBatch, Saves, Sink, whole_call
from clouseau.ir.verify import verify

__all__ = ["ModuleHooks", "hook_capture", "hooked_paths", "module_paths_selected"]

# What calling a module runs, unless its class has a __call__ of its own (or torch.fx,
# tracing in this thread, has patched nn.Module's).
_MODULE_CALL = torch.nn.Module.__call__


class _Hook:
    """The forward hook of one hooked module: a weak reference to its :class:`ModuleHooks`,
    the module's identity and its ``(path, module type)``, fixed when it is installed.

    A copy of the model (``copy.deepcopy``) shares the hook, which ignores every module
    but its own; a pickled model carries an inert hook, not the capture.
    """

    __slots__ = ("ident", "owner", "where")
    clouseau_hook = True  # not a user's hook: the tracers leave it out (_compat.user_forward_hooks)

    def __init__(self, owner: ModuleHooks, module: torch.nn.Module, where: tuple[str, str]) -> None:
        self.owner = weakref.ref(owner)
        self.ident = id(module)  # the owner holds the model: the id stays the module's
        self.where = where

    def __call__(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        # Runs for every hooked module's every call: the owner's state is read here, not
        # through a method (a Python frame per value less).
        owner = self.owner()
        # No call open in this thread, or a copy of the model (which shares the hook).
        if owner is None or owner._active != get_ident() or id(module) != self.ident:
            return
        where = self.where
        if isinstance(out, torch.Tensor):  # most modules: one value, no element walk
            owner._met.append((where, owner._value(out), out.dim(), out.dtype))
            return
        elements = tuple(
            (s, owner._value(v), v.dim(), v.dtype)
            for s, v in element_paths(out)
            if isinstance(v, torch.Tensor)
        )
        if elements:
            owner._met.append((where, elements))

    def __deepcopy__(self, memo: dict[int, Any]) -> _Hook:
        return self

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _inert_hook, ()


class _EagerHook(_Hook):
    """A hook TorchDynamo does not trace: a graph break, the hook running on real values."""

    __slots__ = ()

    @torch.compiler.disable
    def __call__(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        _Hook.__call__(self, module, args, out)


def _inert_hook() -> Any:
    return _no_hook


def _no_hook(module: torch.nn.Module, args: Any, out: Any) -> None:
    return None


# One module output met in a call: ((path, module type), ((suffix, value index, rank,
# dtype), ...)), or ((path, module type), value index, rank, dtype) for a tensor (most
# modules: one tuple per value); the values, copied to the host, are listed once per call.
# The sequence of a call's outputs is the key of its graph.
_Met = (
    tuple[tuple[str, str], tuple[tuple[str, int, int, Any], ...]]
    | tuple[tuple[str, str], int, int, Any]
)
# What a sequence of module outputs saves, computed at its first call: the graph id, the
# indices of the saved values among the call's (None: all of them, in order) and their
# names and nodes.
_Found = tuple[int, tuple[int, ...] | None, Saves]


class ModuleHooks:
    """Saves the selected module outputs of ``model``'s calls into ``sink``.

    Parameters
    ----------
    model, select, sink
        The model, the selection and where saved values go.
    paths
        The module paths to hook; None: every submodule (the dynamic and hook tiers).
    trace_kind
        The frontend of the graphs it records: :attr:`TraceKind.TORCH_DYNAMO` when the
        model runs under TorchDynamo (the dynamic tier), where each hook is a graph break,
        so that it runs eagerly on the real values whether Dynamo compiles or skips the
        frame around it.

    A call is opened by :meth:`run` (one call of the model), by a root of
    :meth:`installed` (``generate``: each forward step is a call), or by the caller
    (:meth:`within`, the dynamic tier's call).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        select: SelectLike,
        sink: Sink,
        paths: tuple[str, ...] | None = None,
        *,
        trace_kind: TraceKind = TraceKind.TORCH_HOOKS,
    ) -> None:
        self._model = model
        self._select = select
        self._sink = sink
        self._put_call = whole_call(sink)  # a call's values at its end, in one sink call
        named = dict(model.named_modules())
        chosen = paths if paths is not None else tuple(p for p in named if p)
        self._hooked = tuple((named[p], (p, type(named[p]).__name__)) for p in chosen)
        self._trace_kind = trace_kind
        self._hook_type = _EagerHook if trace_kind is TraceKind.TORCH_DYNAMO else _Hook
        self._installed = False
        # Per sequence of module outputs: its graph id and, per saved value, (index, node,
        # names); computed on the first call of the sequence.
        self._graphs: dict[tuple[_Met, ...], _Found] = {}
        self._last: tuple[list[_Met], _Found] | None = None
        self._module_infos: tuple[ModuleInfo, ...] | None = None
        self.graphs = 0
        self.saved = 0  # how many values the latest call saved
        # The open call: set only while one runs, in the thread that runs it (the hooks
        # ignore other threads, which may run the model itself meanwhile). ``_active`` is
        # that thread while a call is open (the one check a hook makes), ``_thread`` the
        # thread a root's call opens in (``installed``).
        self._thread: int | None = None
        self._active: int | None = None
        self._root: torch.nn.Module | None = None
        self._begun = False  # whether a call has begun in the sink (see _close)
        self._met: list[_Met] = []
        # Per value of the open call: its host copy, and the tensor (kept alive till the
        # call ends, so that no other tensor takes its id).
        self._arrays: list[Any] = []
        self._tensors: list[torch.Tensor] = []
        self._seen: dict[Any, int] = {}
        self._lock = threading.Lock()

    def _install(self) -> None:
        if self._installed:
            return
        hook = self._hook_type
        handles = [m.register_forward_hook(hook(self, m, where)) for m, where in self._hooked]
        self._installed = True
        weakref.finalize(self, _remove, handles)

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One call of the model, its selected module outputs saved as one call."""
        if self._thread == get_ident():
            # The model called from inside its own call (its forward, a hook, generate's
            # step) in this thread, which holds the lock: its outputs are that call's.
            return self._model(*args, **kwargs)
        if not self._installed:
            self._install()
        with self._lock:
            self._thread = self._active = get_ident()  # _open, inline: it runs every call
            if self._met or self._tensors:
                self._clear()
            model = self._model
            try:
                # The model's forward itself where nn.Module.__call__ would only call it
                # (the hooks are its submodules'): two Python frames less per call.
                if type(model).__call__ is _MODULE_CALL and not module_dispatches(model):
                    out = model.forward(*args, **kwargs)
                else:
                    out = model(*args, **kwargs)
            except BaseException as error:
                self._abort(error)
                raise
            self._close()
        return out

    @contextmanager
    def installed(self, roots: Sequence[torch.nn.Module]) -> Iterator[None]:
        """Each call of a root (``model``, an encoder ``generate`` runs on its own) that
        starts while no call is open is one call of the capture, while the block runs."""
        self._install()
        with self._lock:
            handles = []
            for root in roots:
                handles.append(root.register_forward_pre_hook(self._root_begins))
                handles.append(root.register_forward_hook(self._root_ends))
            self._thread = get_ident()
            try:
                yield
            except BaseException as error:
                if self._active is not None:  # the model failed inside a call
                    self._abort(error)
                raise
            finally:
                self._thread = None
                for handle in handles:
                    handle.remove()

    @contextmanager
    def within(self, call: int) -> Iterator[None]:
        """Save the module outputs met while the block runs into ``call``, opened and ended
        by the caller (the dynamic tier, whose regions save into the same call)."""
        self._install()
        with self._lock:
            self._thread, self._root = get_ident(), None
            self._clear()
            self._active = self._thread
            try:
                yield
                put = self._batch()
                if put is not None:
                    self._sink.put(call, put[0], SavedBatch(put[1], put[2]))
            finally:
                self._thread = self._active = None
                self._clear()

    def discard(self) -> None:
        """Drop what the open call met so far (the dynamic tier runs the call again)."""
        self._clear()

    def _root_begins(self, module: torch.nn.Module, args: Any) -> None:
        if self._active is None and get_ident() == self._thread:
            self._open(module)

    def _root_ends(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if module is self._root and self._active is not None:
            thread = self._thread
            self._close()
            self._thread = thread  # still installed: the next step is a call

    def _open(self, root: torch.nn.Module) -> None:
        self._thread = self._active = get_ident()
        self._root = root
        if self._met or self._tensors:  # every end of a call clears them already
            self._clear()

    def _close(self) -> None:
        # The sink hears of a call only at its end, in one call (whole_call: begin, put and
        # end at once): nothing of it runs per module output, and the first call of a
        # capture begins in the sink (which replaces an earlier capture at its path) only
        # once it has run, so a rerun that fails on a wrong input leaves the earlier
        # capture whole.
        try:
            put = self._batch()  # a new sequence's graph may be refused (its dtypes)
        except BaseException as error:
            self._abort(error)
            raise
        self._thread = self._active = self._root = None
        self._met = []  # _clear, inline (the previous list may be _last's key)
        self._arrays.clear()
        self._tensors.clear()
        self._seen.clear()
        # Begun even where the sink raises: a refused value leaves the call numbered and
        # failed, and a closed or stopped capture begins no call again.
        self._begun = True
        if put is None:  # a call that met no output is a call of the capture all the same
            sink = self._sink
            sink.end_call(sink.begin_call())
        else:
            self._put_call(*put)

    def _abort(self, error: BaseException) -> None:
        # A call that failed is one of the capture, failed, once it met a selected output
        # or an earlier call began (what it met is lost with it, as a call's values are
        # put at its end).
        began = self._begun or bool(self._met)
        self._thread = self._active = self._root = None
        self._clear()
        if began:
            try:
                call = self._sink.begin_call()
            except CaptureError:  # a closed or stopped capture: ``error`` says why
                return
            self._begun = True
            self._sink.fail_call(call, error)

    def _clear(self) -> None:
        # A new list of outputs met (the previous one may be ``_last``'s key); the values
        # are emptied in place, their arrays already handed to the sink (as a tuple).
        self._met = []
        self._arrays.clear()
        self._tensors.clear()
        self._seen.clear()

    def _value(self, t: torch.Tensor) -> int:
        """The index of ``t``'s value in this call, copied to the host on first sight.

        A tensor two modules return unchanged (a block's output that is its last ReLU's,
        ``nn.Identity``) is one value, saved once with all its names, as in the traced
        tiers (a view is another value there too); a later in-place op bumps its version
        and makes another value.
        """
        # The object, not its memory: the call holds it, so its id is not reused.
        version = tensor_version(t)
        tensors = self._tensors
        # An inference tensor counts no in-place op: each sighting is a value of its own.
        ident = (id(t), version if version is not None else ~len(tensors))
        found = self._seen.get(ident)
        if found is None:
            found = self._seen[ident] = len(tensors)
            # numpy() shares a CPU tensor's memory (no detached tensor made and dropped,
            # as numpy(force=True) does); to_numpy for what it refuses.
            try:
                array = t.numpy().copy()
            except (RuntimeError, TypeError):
                array = to_numpy(t)
            self._arrays.append(array)
            # The tensor itself too, till the call ends: its memory is not reused by
            # another tensor meanwhile, which would take its identity.
            tensors.append(t)
        return found

    def _batch(self) -> tuple[int, Saves, tuple[Any, ...]] | None:
        """The graph id and the saved values of the call (a SavedBatch's two parts: the
        names and nodes, made once, and the arrays), None if it met no output."""
        self.saved = 0
        met = self._met
        if not met:
            return None
        # Ranks, not sizes: a new length is no new graph (it shows the first call's sizes;
        # the files keep each array's own). Most calls repeat the previous one's sequence:
        # comparing to it costs less than hashing the sequence.
        last = self._last
        if last is not None and last[0] == met:
            found = last[1]
        else:
            key = tuple(met)
            found = self._graphs.get(key)
            if found is None:
                found = self._graph(met)
                if len(self._graphs) >= 4096:  # unbounded kinds of calls: start over
                    self._graphs.clear()
                self._graphs[key] = found
            self._last = (met, found)
        graph_id, take, saves = found
        self.saved = len(saves.nodes)  # a tuple's len: no frame (Saves.__len__)
        arrays = self._arrays
        picked = tuple(arrays) if take is None else tuple([arrays[i] for i in take])
        return graph_id, saves, picked

    def _graph(self, met: list[_Met]) -> _Found:
        """The graph id of a new sequence of module outputs, the indices of the values it
        saves among the call's, and their nodes and selected names."""
        namer = PointNamer(self._model)
        names = [namer.module_output(m[0][0]) for m in met]
        specs = [(t.shape, t.dtype) for t in self._tensors]
        values = _values(names, met, specs)
        graph = insert_saves(self._module_graph(values), self._select, strict=False)
        chosen = {p.name for p in select_points(graph, self._select, strict=False)}
        saved = [
            (index, value_names[0], picked)
            for index, (value_names, _, _, _) in values.items()
            for picked in [tuple(n for n in value_names if n in chosen)]
            if picked
        ]
        take = tuple(index for index, _, _ in saved)
        saves = Saves(tuple(n for _, _, n in saved), tuple(node for _, node, _ in saved))
        self.graphs += 1
        every = take == tuple(range(len(self._tensors)))
        return self._sink.add_graph(graph), None if every else take, saves

    def _module_graph(self, values: dict[int, tuple[list[str], str, str, Any]]) -> Graph:
        # The inputs as one opaque value: module outputs are the points of this path.
        namer = PointNamer(self._model)
        source = free_name("input", (n for ns, _, _, _ in values.values() for n in ns))
        nodes = [Node(source, NodeKind.INPUT, "input", outputs=(OpaqueSpec("inputs"),))]
        for value_names, path, kind, (shape, dtype) in values.values():
            nodes.append(
                Node(
                    name=value_names[0],
                    kind=NodeKind.OP,
                    op=kind.lower(),
                    inputs=(Ref(source),),
                    outputs=(spec_of(torch.empty(shape, dtype=dtype, device="meta")),),
                    module=namer.path(path),
                    module_type=kind,
                    aliases=tuple((0, n) for n in value_names[1:]),
                    attrs=(("module_output", True), *category_attr(category(kind))),
                )
            )
        taken = {n for node in nodes for n in (node.name, *(a for _, a in node.aliases))}
        nodes.append(Node(free_name("output", taken), NodeKind.OUTPUT, "output"))
        if self._module_infos is None:
            self._module_infos = tuple(
                ModuleInfo(path, type(m).__name__, sum(p.numel() for p in m.parameters()))
                for path, m in self._model.named_modules()
            )
        return verify(
            Graph(
                nodes=tuple(nodes),
                name=type(self._model).__name__,
                trace_kind=self._trace_kind,
                modules=self._module_infos,
                meta=(("training", self._model.training), ("tier", "hooks")),
            )
        )


def _remove(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


def _values(
    names: list[str], met: list[_Met], specs: list[tuple[Any, Any]]
) -> dict[int, tuple[list[str], str, str, Any]]:
    """Per value of the call, in order of first sight: every name it has, and the module
    path, type and (shape, dtype) of its first producer (``specs``, by value index)."""
    values: dict[int, tuple[list[str], str, str, Any]] = {}
    for name, (where, *rest) in zip(names, met, strict=True):
        path, kind = where
        els = rest[0] if len(rest) == 1 else (("", *rest),)
        for position, (suffix, index, _, _) in enumerate(els):
            value = values.setdefault(index, ([], path, kind, specs[index]))
            fresh = element_names(name, suffix, position == 0)
            value[0].extend(n for n in fresh if n not in value[0])
    return values


def hook_capture(
    model: torch.nn.Module, select: SelectLike, sink: Sink, plain: bool
) -> ModuleHooks | None:
    """The hook path's capture, or None when it cannot serve the call.

    ``plain``: no interventions and no gradients, which need the traced graph.
    """
    paths = module_paths_selected(model, select) if plain else None
    return ModuleHooks(model, select, sink, paths) if paths else None
