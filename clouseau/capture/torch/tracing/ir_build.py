"""Trace a module (fx first, torch.export as the fallback) and build the verified IR graph."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture._common import (
    check_arguments,
    describe_call,
    describe_other,
    first_line,
    inputs_rejected,
)
from clouseau.capture.torch._quiet import quiet_export
from clouseau.capture.torch._sync import TRACE_LOCK
from clouseau.capture.torch.flop_ops import category
from clouseau.capture.torch.naming.points import free_name
from clouseau.capture.torch.tracing.elements import module_outputs, with_elements
from clouseau.capture.torch.tracing.export import LeafShapes, trace_export
from clouseau.capture.torch.tracing.fx import trace_fx
from clouseau.capture.torch.tracing.live import PROVISIONAL, LivePlan
from clouseau.capture.torch.tracing.probe import FirstRun, Probe, probe, probe_call
from clouseau.capture.torch.tracing.sources import source_from_exception, source_from_stack
from clouseau.capture.torch.tracing.specs import spec_of
from clouseau.capture.torch.tracing.symbolic import Symbols, export_symbols, fx_symbols
from clouseau.capture.torch.tracing.traced import NodeInfo, Traced
from clouseau.ir.canonical_names import add_canonical_names
from clouseau.ir.errors import SelectionError, TraceError
from clouseau.ir.flops import category_attr
from clouseau.ir.graph import (
    AttrValue,
    Graph,
    ModuleInfo,
    Node,
    NodeKind,
    OpaqueSpec,
    Ref,
    Spec,
    TensorSpec,
    TraceKind,
)
from clouseau.ir.verify import verify


class UntraceableError(TraceError):
    """Neither torch.fx nor torch.export can trace the model (its control flow, not its
    inputs): ``reasons`` holds the first line of each tracer's error."""

    def __init__(self, message: str, reasons: tuple[str, ...]) -> None:
        super().__init__(message)
        self.reasons = reasons


class FirstRunSlot:
    """The user's first call when the probe ran it (``live``); taken once, then empty."""

    def __init__(self, run: FirstRun | None = None) -> None:
        self._run = run

    def take(self) -> FirstRun | None:
        run, self._run = self._run, None
        return run


@dataclass(frozen=True, eq=False)
class TracedModel:
    """A traced model, the facts of its probe run, and its IR graph (without saves)."""

    traced: Traced
    probe: Probe
    graph: Graph
    first: FirstRunSlot = field(default_factory=FirstRunSlot)


def trace_model(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    live: bool = False,
    changes: Callable[[Graph], LivePlan] | None = None,
    shapes_seen: tuple[LeafShapes, ...] = (),
) -> TracedModel:
    """Trace ``model(*args, **kwargs)`` with torch.fx, or torch.export when fx fails.

    ``shapes_seen``: the earlier shapes of this input structure, for the export fx's
    failure leads to (:func:`~clouseau.capture.torch.tracing.export.trace_export`: static
    for a structure's first shape, dynamic in the dimensions that changed for later ones;
    :mod:`runtime.tiers` decides).

    With ``live`` the probe run is the user's call itself (its output and values are in
    ``first``); otherwise it runs on copies and leaves the model, hooks aside, untouched.
    ``changes`` (with ``live``): the plan of the interventions and gradient taps the call
    applies, from the provisional IR of the traced graph.

    Raises
    ------
    TypeError
        ``model`` is not an ``nn.Module``.
    ArgumentError
        The arguments do not fit ``model.forward``'s signature.
    TraceError
        Neither tracer could trace the model; the message names both causes and the fix.
    """
    if not isinstance(model, torch.nn.Module):
        if callable(model):
            raise TypeError(
                f"clouseau's torch frontend traces an nn.Module, not a {type(model).__name__}: "
                "wrap the function in an nn.Module whose forward calls it"
            )
        raise TypeError(f"clouseau cannot trace a {type(model).__name__}: pass a torch.nn.Module")
    check_arguments(
        model.forward,
        f"{type(model).__name__}.forward",
        args,
        kwargs,
        _describe_inputs(args, kwargs),
    )
    # Tracers patch torch.nn.Module process-wide: no lowered graph may run meanwhile.
    with TRACE_LOCK.exclusive():
        return _trace_model(model, args, kwargs, live, changes, shapes_seen)


def _trace_model(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    live: bool,
    changes: Callable[[Graph], LivePlan] | None,
    shapes_seen: tuple[LeafShapes, ...],
) -> TracedModel:
    fx_infos: Mapping[str, NodeInfo] | None = None
    run = partial(_live_probe, changes) if live else _probe
    try:
        traced = trace_fx(model, args, kwargs)
        fx_infos = traced.infos
        facts, first = run(traced, model, args, kwargs)
    except Exception as fx_error:
        try:
            with quiet_export():
                traced = trace_export(model, args, kwargs, shapes_seen)
            traced = replace(traced, meta=(*traced.meta, ("fx_error", first_line(fx_error))))
            facts, first = run(traced, model, args, kwargs)
        except Exception as export_error:
            if fx_infos is not None:
                # fx followed the code but the traced ops failed on the example values:
                # the inputs (shapes, dtypes, types) do not fit the model.
                message = _inputs_rejected(model, args, kwargs, fx_error, export_error, fx_infos)
                raise TraceError(message) from export_error
            raise UntraceableError(
                _both_failed(model, fx_error, export_error),
                (
                    f"torch.fx: {first_line(fx_error)}",
                    f"torch.export: {first_line(export_error)}",
                ),
            ) from export_error
    traced, facts, first = with_elements(traced, facts, first)
    if traced.opaque_outputs:
        listed = ", ".join(f"{path} ({kind})" for path, kind in traced.opaque_outputs)
        warnings.warn(
            f"clouseau: {len(traced.opaque_outputs)} module output(s) of "
            f"{type(model).__name__} hold no traced tensor and are not points: {listed}. "
            "Select a tensor computed from them instead.",
            stacklevel=2,
        )
    symbols = (
        fx_symbols(traced.gm, model, traced.to_inputs(args, kwargs))
        if traced.frontend is TraceKind.TORCH_FX
        else export_symbols(traced.gm.graph)
    )
    graph = build_graph(model, traced, facts, symbols)
    return TracedModel(traced, facts, graph, FirstRunSlot(first))


def _probe(
    traced: Traced, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Probe, None]:
    return probe(traced.gm, model, traced.to_inputs(args, kwargs), module_outputs(traced)), None


def _live_probe(
    changes: Callable[[Graph], LivePlan] | None,
    traced: Traced,
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Probe, FirstRun]:
    plan = None
    if changes is not None:
        # Names and point kinds do not depend on shapes, but canonical names do: the specs
        # torch.export recorded where there are some.
        nodes = {n.name: n for n in traced.gm.graph.nodes}
        specs = {name: _traced_spec(nodes.get(name)) for name in traced.infos}
        provisional = Probe(specs, frozenset(), frozenset())
        try:
            plan = changes(build_graph(model, traced, provisional))
        except SelectionError:
            # A name the graph has only once its shapes are known (a canonical name of an
            # fx-traced model): probe on copies first; the call then runs instrumented.
            return _probe(traced, model, args, kwargs)
    inputs = traced.to_inputs(args, kwargs)
    return probe_call(traced.gm, model, inputs, plan, module_outputs(traced))


def _traced_spec(node: fx.Node | None) -> Spec:
    value = node.meta.get("val") if node is not None else None
    if value is None:
        return PROVISIONAL
    try:
        return spec_of(value)
    except Exception:  # a symbolic size: no shape yet
        return PROVISIONAL


def build_graph(
    model: torch.nn.Module,
    traced: Traced,
    facts: Probe,
    symbols: Mapping[str, Symbols] | None = None,
) -> Graph:
    """The verified IR of ``traced``, with the specs observed by ``facts``.

    ``symbols`` (by fx node name) marks the dimensions that follow the inputs' sizes.
    """
    symbols = symbols or {}
    nodes: list[Node] = []
    by_fx: dict[str, str] = {}
    taken: set[str] = set()
    static: set[str] = set()  # nodes that depend on no input
    points = {n for i in traced.infos.values() if i.kind is not NodeKind.OUTPUT
              for n in (i.name, *i.aliases)}  # fmt: skip
    for fx_node in traced.gm.graph.nodes:
        info = traced.infos.get(fx_node.name)
        if info is None:
            continue
        if info.kind is NodeKind.OUTPUT:  # a module called `output` keeps its name
            info = replace(info, name=free_name(info.name, points))
        inputs = tuple(Ref(by_fx[a.name]) for a in _flat_inputs(fx_node) if a.name in by_fx)
        outputs = (
            ()
            if info.kind is NodeKind.OUTPUT
            else (_with_symbols(facts.specs.get(fx_node.name), symbols.get(fx_node.name)),)
        )
        taken.add(info.name)
        if info.kind is NodeKind.CONSTANT or (
            info.kind is NodeKind.OP and all(r.node in static for r in inputs)
        ):
            static.add(info.name)
        nodes.append(
            Node(
                name=info.name, kind=info.kind, op=info.op, inputs=inputs, outputs=outputs,
                module=info.module, module_type=info.module_type, target=info.target,
                source=info.source, key=fx_node.name,
                aliases=tuple((0, a) for a in info.aliases),
                attrs=_module_attrs(model, fx_node)
                + _point_kind(info, inputs, static, fx_node.name in facts.plain)
                + category_attr(category(info.op))
                + kernel_attrs(fx_node, info.op),
            )
        )  # fmt: skip
        by_fx[fx_node.name] = info.name
    graph = Graph(
        nodes=_unique_aliases(nodes, taken),
        name=type(model).__name__,
        trace_kind=traced.frontend,
        modules=_modules(model),
        meta=(("training", model.training), *traced.meta),
    )
    # Canonical names (blocks.0.resid_post, ...) are aliases inferred from the graph.
    return verify(add_canonical_names(graph, computed=True))


def _with_symbols(spec: Spec | None, symbols: Symbols | None) -> Spec:
    if spec is None:
        return OpaqueSpec("None")
    if symbols and isinstance(spec, TensorSpec) and len(symbols) == len(spec.shape):
        return replace(spec, symbols=symbols)
    return spec


def _point_kind(
    info: NodeInfo, inputs: tuple[Ref, ...], static: set[str], plain: bool
) -> tuple[tuple[str, AttrValue], ...]:
    """The attrs that make a value a point in spite of Graph.points' rule for state.

    A module's output computed from state alone (a position embedding fed by a buffer) is
    a point like any module output. Parameters, buffers, what is computed from them alone
    and non-tensor values (shapes, ints, None) are points that only their exact name
    selects (torchvision names them; a bare ``"*"`` would write the state every call).
    """
    if info.kind is NodeKind.OUTPUT or (info.kind is NodeKind.INPUT and not plain):
        return ()
    is_static = info.kind is NodeKind.CONSTANT or all(r.node in static for r in inputs)
    if info.module_output and is_static:
        return (("module_output", True),)
    if not info.module_output and (is_static or plain):
        return (("point", "exact"),)
    return ()


# The arguments of torch.nn.functional.scaled_dot_product_attention, in order.
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def kernel_attrs(fx_node: fx.Node, op: str) -> tuple[tuple[str, AttrValue], ...]:
    """The options of a ``scaled_dot_product_attention`` call, as IR attrs (else none):
    what a computed attention pattern beside it needs (``lowering/computed.py``)."""
    if op != "scaled_dot_product_attention" or fx_node.op != "call_function":
        return ()
    bound = sdpa_arguments(fx_node)
    nodes = [a for a in fx_node.args[:3] if isinstance(a, fx.Node)]
    mask = bound.get("attn_mask")
    scale = bound.get("scale")
    if len(nodes) != 3 or not (scale is None or isinstance(scale, int | float)):
        return ()
    return (
        ("scale", None if scale is None else float(scale)),
        ("is_causal", bool(bound.get("is_causal", False))),
        ("mask", 3 if isinstance(mask, fx.Node) else -1),
        ("dropout_p", float(bound.get("dropout_p", 0.0) or 0.0)),
        ("enable_gqa", bool(bound.get("enable_gqa", False))),
    )


def sdpa_arguments(fx_node: fx.Node) -> dict[str, Any]:
    """A ``scaled_dot_product_attention`` call's arguments by name."""
    return dict(zip(SDPA_ARGS, fx_node.args, strict=False)) | dict(fx_node.kwargs)


# Hyper-parameters of leaf modules that FLOP counts need (a conv's kernel and groups
# are not in its input or output shapes; attention's layout is not either).
_HYPER = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation",
          "groups", "embed_dim", "num_heads", "batch_first")  # fmt: skip


def _module_attrs(model: torch.nn.Module, fx_node: fx.Node) -> tuple[tuple[str, AttrValue], ...]:
    if fx_node.op != "call_module":
        return ()
    module = model.get_submodule(str(fx_node.target))
    found: list[tuple[str, AttrValue]] = []
    for name in _HYPER:
        value = getattr(module, name, None)
        if isinstance(value, bool | int | str) or (
            isinstance(value, tuple) and all(isinstance(v, int) for v in value)
        ):
            found.append((name, value))
    return tuple(found)


def _flat_inputs(node: fx.Node) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), found.append)
    return found


def _unique_aliases(nodes: list[Node], taken: set[str]) -> tuple[Node, ...]:
    # A module path that is also a node name (or a repeated alias) would make two points
    # with one name; the node name wins and the alias is dropped.
    out = []
    for node in nodes:
        kept = []
        for index, alias in node.aliases:
            if alias not in taken:
                taken.add(alias)
                kept.append((index, alias))
        out.append(replace(node, aliases=tuple(kept)) if len(kept) != len(node.aliases) else node)
    return tuple(out)


def _modules(model: torch.nn.Module) -> tuple[ModuleInfo, ...]:
    return tuple(
        ModuleInfo(path, type(m).__name__, sum(p.numel() for p in m.parameters()))
        for path, m in model.named_modules()
    )


def _both_failed(
    model: torch.nn.Module, fx_error: BaseException, export_error: BaseException
) -> str:
    # No frame of the user's in the tracebacks (a torch module fails): the user's call.
    where = (
        source_from_exception(fx_error)
        or source_from_exception(export_error)
        or source_from_stack()
    )
    at = f" at {where.file}:{where.line} ({where.code})" if where else ""
    return (
        f"cannot trace {type(model).__name__}{at}.\n"
        f"  torch.fx failed: {first_line(fx_error)}\n"
        f"  torch.export failed: {first_line(export_error)}\n"
        f"Fix: {_fix(export_error)}"
    )


_UNKNOWN_TYPE = re.compile(r"Found <class '([^']+)'> in (input|output)|not a known type|pytree")


def _fix(export_error: BaseException) -> str:
    """What to change, from torch.export's cause (the fallback's error is the last word)."""
    found = _UNKNOWN_TYPE.search(str(export_error))
    if found:
        what = f"a {found.group(1)} in its {found.group(2)}" if found.group(1) else "a value"
        return (
            f"the model takes or returns {what} that torch.export cannot flatten: register "
            "its type with torch.utils._pytree.register_pytree_node, or pass and return "
            "tensors, tuples, lists and dicts of them."
        )
    return (
        "make the control flow on tensor values traceable (torch.where, or torch.cond "
        "for branches), or mark the offending submodule as a leaf with "
        "clouseau.capture.torch.mark_leaf(model.<path>) so it runs untraced as one node."
    )


def _describe_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``float32[2, 4], mask=bool[2]``: the inputs of a call, for error messages."""
    return describe_call(args, kwargs, _describe)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}[{', '.join(str(d) for d in value.shape)}]"
    if isinstance(value, list | tuple):
        inner = ", ".join(_describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in value.items()) + "}"
    return describe_other(value)


def _inputs_rejected(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fx_error: BaseException,
    export_error: BaseException,
    fx_infos: Mapping[str, NodeInfo],
) -> str:
    # The fx Interpreter names the node it was running ("While executing %fc"); its
    # source line is the user's, which the traceback (inside the GraphModule) lacks.
    running = re.search(r"While executing %(\w+)", str(fx_error))
    info = fx_infos.get(running.group(1)) if running else None
    where = (
        (info.source if info else None)
        or source_from_exception(fx_error)
        or source_from_exception(export_error)
        or source_from_stack()
    )
    at = f" at {where.file}:{where.line} ({where.code})" if where else ""
    why = (
        f".\n  torch.fx traced it, but running it failed: {first_line(fx_error)}\n"
        f"  torch.export failed: {first_line(export_error)}"
    )
    message = inputs_rejected(
        type(model).__name__, _describe_inputs(args, kwargs), at, why, expects="weights"
    )
    return f"{message} If the model itself runs on these inputs, please report a clouseau bug."
