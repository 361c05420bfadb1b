"""A ``torch.compile`` backend that instruments every graph TorchDynamo hands it.

Dynamo splits a model at its graph breaks (Python control flow on tensor values, code it
cannot follow) into *regions*, and calls its backend once per region with an FX graph.
:class:`RegionCompiler` builds each region's IR with the names of the static tiers
(``<module path>.<op>`` with local counters, from ``nn_module_stack``), inserts the saves
with the same rewrite pass, lowers it, and optionally hands the instrumented graph to
another backend (Inductor, ``aot_eager``). Each run of a region puts its saved values into
the current call of the sink: the call an instrumented model opened, or one call per
region run when the backend is used on its own.

Names are global across the regions of one compiler: a node keeps the name it first got
(keyed by its region-local name and source line), so a region compiled again (a new
shape, a recompile) names its nodes as before, and two regions never share a name unless
they run the same code (a loop body, whose runs are saved in order within the call).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch._compat import dynamo_frame_module, example_value, running_module
from clouseau.capture.torch.dynamic.stack import stack_infos
from clouseau.capture.torch.lowering.lower import SaveTarget, lower_traced
from clouseau.capture.torch.naming.points import PointNamer
from clouseau.capture.torch.runtime.host import to_numpy
from clouseau.capture.torch.tracing.ir_build import TracedModel, build_graph
from clouseau.capture.torch.tracing.probe import probe
from clouseau.capture.torch.tracing.specs import host_array
from clouseau.capture.torch.tracing.symbolic import export_symbols
from clouseau.capture.torch.tracing.traced import NodeInfo, Traced
from clouseau.ir.actions import Action
from clouseau.ir.graph import NodeKind, Point, TraceKind
from clouseau.ir.selection import SelectLike, Selector, as_selector
from clouseau.ir.sink import SavedValue, Sink

Compiler = Callable[[fx.GraphModule, Sequence[Any]], Callable[..., Any]]

# L['self']._modules['layers']._modules['0']._parameters['weight'] -> layers.0.weight
_ATOM = re.compile(r"_(modules|parameters|buffers)\['([^']+)'\]|\['([^']+)'\]|\[(\d+)\]|(\w+)")


@dataclass(frozen=True)
class _Region:
    """One instrumented region: how to run it and what its saved tensors are."""

    run: Callable[..., Any]
    graph_id: int
    targets: tuple[SaveTarget, ...]
    saves: bool
    outputs: int = -1  # the count of outputs before the saves in a flat result; -1: nested


class RegionCompiler:
    """A ``torch.compile`` backend: instrument each region, then compile it with ``compiler``.

    Parameters
    ----------
    select, intervene
        As for :func:`clouseau.instrument`.
    sink
        Where saved values go.
    compiler
        The backend that compiles the instrumented region (``None``: run it as is).
    root
        The model, when known (its class names the graphs, its mode is recorded).
    module_outputs
        Whether the regions save module outputs; False where forward hooks save them
        (the dynamic tier): a region then saves ops only (the tier saves the model's
        inputs), and a frame Dynamo skips is no failure, as the hooks see its modules.
    """

    def __init__(
        self,
        select: SelectLike,
        sink: Sink,
        *,
        intervene: Mapping[Any, Action] | None = None,
        compiler: Compiler | None = None,
        root: torch.nn.Module | None = None,
        module_outputs: bool = True,
    ) -> None:
        self._select = select
        self._module_outputs = module_outputs
        self._intervene = intervene
        self._sink = sink
        self._compiler = compiler
        self._root = root
        self._paths = {id(m): p for p, m in root.named_modules()} if root is not None else {}
        self._names: dict[tuple[Any, ...], str] = {}
        self._model = root if root is not None else torch.nn.Module()
        self._namer = PointNamer(self._model)  # the names across regions
        self._lock = threading.Lock()
        self._local = threading.local()
        self._watched = False  # whether the root of the backend on its own is hooked
        self._open: set[int] = set()
        self.traces = 0

    @contextlib.contextmanager
    def call(self, call: int) -> Iterator[None]:
        """Put what regions save in this thread into ``call`` until the block exits."""
        outer = getattr(self._local, "call", None)
        self._local.call = call
        self._local.saved = 0
        try:
            yield
        finally:
            self._local.call = outer

    @property
    def saved(self) -> int:
        """How many values the regions saved into this thread's latest :meth:`call`."""
        return getattr(self._local, "saved", 0)

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        with self._lock:
            frame, where = self._frame()
            self._watch_root()
        region = self._region(gm, example_inputs, where)
        if frame is None or self._select is None:
            return region.run if not region.saves else lambda *args: self._run(region, args)
        # A nested module's frame: Dynamo runs this code for every instance of the class
        # its guards let through (each layer of a stack), while the names are those of
        # the instance it was compiled for; the instance running takes its own names.
        regions = {id(frame): region}

        def run(*args: Any) -> Any:
            module = running_module()
            found = regions.get(id(module))
            if found is None:
                path = self._paths.get(id(module))
                if path is None:  # not a module of the model: as compiled
                    found = region
                else:
                    where = (path, type(module).__qualname__)
                    found = regions[id(module)] = self._region(gm, args, where)
            return self._run(found, args) if found.saves else found.run(*args)

        return run

    def _region(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], frame: tuple[str, str]
    ) -> _Region:
        """``gm`` instrumented as the region of ``frame`` (its module's path and class)."""
        with self._lock:
            traced = self._traced(gm, frame)
            inputs = tuple(map(example_value, example_inputs))
            root = self._root if self._root is not None else torch.nn.Module()
            facts = probe(gm, root, inputs)
            symbols = export_symbols(gm.graph, "example_value")
            model = TracedModel(traced, facts, build_graph(root, traced, facts, symbols))
            select = self._select
            if select is not None and (_resumed(gm) or frame[0] or not self._module_outputs):
                # A resumed region's inputs, or those of a nested module's frame, are
                # values computed before (and saved): not points of their own here; the
                # dynamic tier saves the model's inputs itself (dynamo.InputPoints).
                select = as_selector(select) & Selector(_not_an_input, "not an input")
            if select is not None and not self._module_outputs:
                select = as_selector(select) & Selector(_not_a_module_output, "an op")
            lowered = lower_traced(model, select, intervene=self._intervene, strict=False)
            graph_id = self._sink.add_graph(lowered.graph)
            self.traces += 1
        module = lowered.module
        if self._compiler is None:
            return _Region(module.forward, graph_id, lowered.targets, bool(lowered.saves))
        # A backend takes a graph with one flat tuple of outputs: saves after outputs.
        flat, count = _flattened(module) if lowered.saves else (module, -1)
        run = self._compiler(flat, list(example_inputs))
        return _Region(run, graph_id, lowered.targets, bool(lowered.saves), count)

    def _run(self, region: _Region, args: tuple[Any, ...]) -> Any:
        raw = region.run(*args)
        if region.outputs >= 0:
            outputs, saved = tuple(raw[: region.outputs]), raw[region.outputs :]
        else:
            outputs, saved = raw
        values = [
            SavedValue(
                t.names,
                t.node,
                to_numpy(v, copy=t.host_copy) if isinstance(v, torch.Tensor) else host_array(v),
            )
            for t, v in zip(region.targets, saved, strict=True)
        ]
        call = getattr(self._local, "call", None)
        if call is not None:
            self._local.saved += len(values)
            self._sink.put(call, region.graph_id, values)
        else:  # the backend on its own: the call of the compiled model now running
            self._sink.put(self._user_call(), region.graph_id, values)
        return outputs

    def _user_call(self) -> int:
        """The call of the compiled model running in this thread, begun if none is: its
        regions, graph breaks and all, save into one call. The root's hooks end it; the
        first call, whose root was found while it ran, ends when the next one begins or
        the capture is read (:meth:`end_open`)."""
        call = getattr(self._local, "user_call", None)
        if call is None:
            call = self._local.user_call = self._sink.begin_call()
            with self._lock:
                self._open.add(call)
        return call

    @torch.compiler.disable
    def _root_begins(self, module: torch.nn.Module, args: Any) -> None:
        self._end_user_call()

    @torch.compiler.disable
    def _root_ends(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self._end_user_call()

    def _end_user_call(self) -> None:
        call = getattr(self._local, "user_call", None)
        self._local.user_call = None
        if call is not None:
            with self._lock:
                self._open.discard(call)
            self._sink.end_call(call)

    def end_open(self) -> None:
        """End the calls still open (the first one, whose root hooks came too late)."""
        with self._lock:
            calls, self._open = sorted(self._open), set()
        for call in calls:
            self._sink.end_call(call)
        self._local.user_call = None

    def _watch_root(self) -> None:
        """On the first compile of the backend on its own: hook the compiled model's root,
        whose calls delimit the capture's calls."""
        if self._root is not None or self._watched:
            return
        root = dynamo_frame_module()
        if root is not None:
            self._watched = True
            root.register_forward_pre_hook(self._root_begins)
            root.register_forward_hook(self._root_ends)

    def _frame(self) -> tuple[torch.nn.Module | None, tuple[str, str]]:
        """The module whose frame Dynamo compiles, with its path and class; ``None, ("",
        "")`` for the root (a nested module's forward is compiled on its own when its
        caller's frame was skipped, a graph break inside a loop: the hooks see its modules)."""
        frame = dynamo_frame_module()
        if frame is None or self._root is None or frame is self._root:
            return None, ("", "")
        path = self._paths.get(id(frame))
        if path is None:
            return None, ("", "")
        return frame, (path, type(frame).__qualname__)

    def _traced(self, gm: fx.GraphModule, where: tuple[str, str]) -> Traced:
        weights: dict[str, tuple[str, str]] = {}
        inputs: dict[str, str] = {}
        frame, frame_type = where
        prefix = f"{frame}." if frame else ""
        for node in gm.graph.nodes:
            # Dynamo's own stack, kept: a region is named again for another instance.
            own = node.meta.setdefault(_OWN_STACK, node.meta.get("nn_module_stack") or {})
            stack = {
                # Dynamo's keys tell calls apart (``<id>@1`` is the second call).
                prefix + key: (prefix + _dotted(path), cls)
                for key, (path, cls) in own.items()
            }
            if node.op == "placeholder":
                stack = {}  # Dynamo gives an input the stack of its first user: not its own
            # A nested module's frame: its own ops are inside it (``experts.1.gelu``).
            node.meta["nn_module_stack"] = {frame: (frame, frame_type), **stack} if frame else stack
            if node.op != "placeholder":
                continue
            arg = node.meta.get("grapharg")
            source = arg.source.name if arg is not None else str(node.target)
            kind = (
                "parameter"
                if "_parameters[" in source
                else "buffer"
                if "_buffers[" in source
                else ""
            )
            if kind:
                weights[node.name] = (kind, prefix + _dotted(source))
            else:
                inputs[node.name] = prefix + (_dotted(source, in_root=False) or node.name)
        root_type = type(self._root).__name__ if self._root is not None else "compiled"
        infos = stack_infos(gm.graph, PointNamer(self._model), root_type, weights, inputs)
        return Traced(
            gm=gm,
            frontend=TraceKind.TORCH_DYNAMO,
            infos=self._global(infos),
            to_inputs=lambda args, kwargs: tuple(args),
            from_outputs=lambda out: out,
        )

    def _global(self, infos: Mapping[str, NodeInfo]) -> dict[str, NodeInfo]:
        """Region-local names -> names unique across regions, stable across recompiles."""
        out: dict[str, NodeInfo] = {}
        for fx_name, info in infos.items():
            if info.name == "output":
                out[fx_name] = info
                continue
            # A module's output is named by its path wherever it is called (one name
            # across branches); an op by its region-local name and source line.
            module_call = bool(info.module_type) and info.op == info.module_type.lower()
            where = (info.source.file, info.source.line) if info.source and not module_call else ()
            name = self._global_name((info.kind, info.name, *where), module_call)
            aliases = tuple(self._global_name(("alias", a), True) for a in info.aliases)
            out[fx_name] = replace(info, name=name, aliases=aliases)
        return out

    def _global_name(self, key: tuple[Any, ...], module: bool) -> str:
        found = self._names.get(key)
        if found is None:
            found = self._names[key] = self._namer.region(str(key[1]), module=module)
        return found


def _flattened(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """``gm`` returning ``(*outputs, *saves)`` instead of ``(outputs, saves)``."""
    graph = fx.Graph()
    outputs, saves = graph.graph_copy(gm.graph, {})  # type: ignore[misc]
    outputs = tuple(outputs) if isinstance(outputs, tuple | list) else (outputs,)
    graph.output((*outputs, *saves))
    return fx.GraphModule(gm, graph), len(outputs)


def _resumed(gm: fx.GraphModule) -> bool:
    """Whether Dynamo made this region from a resume function (the code after a break)."""
    return any(
        _RESUME in (node.meta.get("stack_trace") or "")
        for node in gm.graph.nodes
        if node.op == "placeholder"
    )


_RESUME = "torch_dynamo_resume_in_"
_OWN_STACK = "clouseau_dynamo_module_stack"


def _not_an_input(point: Point) -> bool:
    return point.node.kind is not NodeKind.INPUT


def _not_a_module_output(point: Point) -> bool:
    """An op's own point: not a module's output (a leaf module's call, or the alias a
    module's single escaping value has), which forward hooks save."""
    node = point.node
    leaf_call = bool(node.module_type) and node.op == node.module_type.lower()
    return not (point.is_alias or leaf_call)


def _dotted(source: str, *, in_root: bool = True) -> str:
    """A Dynamo source or module-stack path as a dotted path (``layers.0.fc``).

    ``in_root``: the source starts at the root module (``L['self']``), whose own name is
    dropped; an input's source (``L['x'][0]``) keeps its variable name (``x.0``).
    """
    atoms: list[str] = []
    for match in _ATOM.finditer(source):
        kind, keyed, quoted, index, word = match.groups()
        if kind is not None:
            atoms.append(keyed)
        elif word in ("L", "G") and not atoms:
            continue
        else:
            atoms.append(quoted or index or word)
    return ".".join(atoms[1:] if in_root else atoms)
