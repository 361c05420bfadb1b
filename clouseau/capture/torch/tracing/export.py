"""The fallback tracer: ``torch.export`` (non-strict), named from ``nn_module_stack``.

torch.export handles what torch.fx cannot (shape-dependent Python control flow, ``len``
or asserts on shapes, ``forward(**kwargs)``, autocast and no_grad regions), at the price
of ATen-level ops. Names follow the fx convention (:mod:`naming.points`): an op is ``<innermost
module path>.<op>`` with a local counter (in-place ``add_`` is named ``add``); module
outputs are found by marks (:mod:`tracing.export_marks`): the node a built-in module's call
returns is named by the call, and every other module output gets its name as an alias.
Weights used only inside built-in modules are left out of the IR, as in the fx graph.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

import torch
import torch.fx as fx
from torch.export.graph_signature import InputKind, OutputKind

from clouseau.capture.torch._compat import (
    check_export_inputs,
    clear_dimension_marks,
    pytree_children,
    register_cache_pytrees,
    tree_flatten,
    tree_flatten_with_path,
    tree_unflatten,
)
from clouseau.capture.torch.naming.points import PointNamer, element_names, function_op, target_name
from clouseau.capture.torch.tracing.caches import CacheAdopter
from clouseau.capture.torch.tracing.export_marks import (
    RETURNED,
    InferenceModeError,
    Mark,
    Marks,
    marking,
    take_marks,
)
from clouseau.capture.torch.tracing.sources import source_from_stack_trace
from clouseau.capture.torch.tracing.traced import (
    NodeInfo,
    Traced,
    canonical_kwargs,
    is_leaf_type_name,
    name_tuple_elements,
)
from clouseau.ir.errors import TraceError
from clouseau.ir.graph import NodeKind, TraceKind

_WEIGHTS = {
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
}


def grad_mode() -> tuple[bool, bool]:
    """Whether grad mode and inference mode are on: an export bakes in the regions of
    ``forward`` that change them relative to the modes it traced under."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled())


#: The leaves of one call's ``tree_flatten((args, kwargs))``: a tensor's shape, else None.
LeafShapes = tuple[tuple[int, ...] | None, ...]


def leaf_shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> LeafShapes:
    """The shapes of a call's tensors, leaf by leaf (what :func:`trace_export` compares)."""
    leaves = tree_flatten((args, kwargs))[0]
    return tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in leaves)


def trace_export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    seen: tuple[LeafShapes, ...] = (),
) -> Traced:
    """Trace ``model`` with ``torch.export.export(strict=False)`` into a :class:`Traced`.

    ``seen``: the shapes of the earlier calls of this input structure. None (a structure's
    first shape) exports statically; otherwise the export is dynamic, the
    ``EXPORT_DYNAMIC`` tier (:func:`clouseau.capture.torch.runtime.tiers.export_tier`
    decides), in the dimensions that differ between this call and one of ``seen``.
    """
    kwargs = canonical_kwargs(model, kwargs)
    register_cache_pytrees(model)
    ep, marks = _export(model, args, kwargs, seen)
    graph = ep.graph_module.graph
    _check_inference(graph)
    weights = {spec.arg.name for spec in ep.graph_signature.input_specs if spec.kind in _WEIGHTS}
    marked = take_marks(ep.graph_module, marks, frozenset(weights))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    attrs: dict[str, Any] = {}
    weight_kind: dict[str, tuple[str, str]] = {}
    for node, spec in zip(placeholders, ep.graph_signature.input_specs, strict=True):
        if spec.kind is InputKind.USER_INPUT:
            continue
        if spec.kind not in _WEIGHTS:
            raise TraceError(
                f"torch.export produced an input clouseau cannot run: {spec.kind.name}"
            )
        target = str(spec.target)
        if spec.kind is InputKind.PARAMETER:
            attrs[target] = model.get_parameter(target)
        elif spec.kind is InputKind.BUFFER:
            attrs[target] = model.get_buffer(target)
        else:
            attrs[target] = ep.constants[target]
        # Read the live weight through get_attr, so the lowered module shares parameters
        # with the model (autograd, .to(), optimisers) instead of holding export's copies.
        with graph.inserting_before(node):
            getter = graph.create_node("get_attr", target)
        getter.meta = dict(node.meta)
        if node in marked:  # a module that returns a weight (a bias it adds later)
            marked[getter] = marked.pop(node)
        node.replace_all_uses_with(getter)
        graph.erase_node(node)
        weight_kind[getter.name] = (_WEIGHTS[spec.kind], target)
    for out_spec in ep.graph_signature.output_specs:
        if out_spec.kind is not OutputKind.USER_OUTPUT:
            raise TraceError(
                f"torch.export produced an output clouseau cannot run: {out_spec.kind.name}"
            )
    # Regions export records as higher-order ops (autocast, set_grad_enabled) are submodules.
    for node in graph.nodes:
        if node.op == "get_attr" and node.target not in attrs:
            found = getattr(ep.graph_module, str(node.target), None)
            if isinstance(found, fx.GraphModule):
                attrs[str(node.target)] = found
    gm = fx.GraphModule(attrs, graph, class_name=type(model).__name__)
    call_sig = ep.module_call_graph[0].signature
    assert call_sig is not None
    in_spec, out_spec = call_sig.in_spec, call_sig.out_spec

    caches = CacheAdopter()
    namer = PointNamer(model)

    def to_inputs(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[Any, ...]:
        caches.remember(a, kw)
        leaves, spec = tree_flatten((tuple(a), canonical_kwargs(model, kw)))
        if spec != in_spec:
            raise TraceError(
                f"the call's argument structure {spec} differs from the traced {in_spec}"
            )
        return tuple(leaves)

    user_inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ranges = ep.range_constraints
    # Export records a `torch.enable_grad()` / `no_grad()` block of forward only where it
    # changes the mode it traces under: the graph serves calls under that mode only.
    mode = grad_mode()

    def accepts(a: tuple[Any, ...], kw: dict[str, Any]) -> bool:
        if grad_mode() != mode:
            return False
        flat, spec = tree_flatten_with_path((tuple(a), canonical_kwargs(model, kw)))
        if spec != in_spec:
            return False
        try:
            check_export_inputs(user_inputs, flat, ranges)
        except Exception:
            return False
        return True

    return Traced(
        gm=gm,
        frontend=TraceKind.TORCH_EXPORT,
        infos=name_tuple_elements(
            gm.graph, _infos(gm.graph, namer, type(model).__name__, weight_kind, marked, marks)
        ),
        to_inputs=to_inputs,
        from_outputs=lambda flat: caches.adopt(tree_unflatten(list(flat), out_spec)),
        opaque_outputs=tuple((namer.path(p), t) for p, t in marks.untraceable.items()),
        meta=(namer.meta,),
        accepts=accepts,
    )


def _check_inference(graph: fx.Graph) -> None:
    """Refuse a graph whose ops ran in a ``torch.inference_mode()`` block of forward that
    calls no submodule (one that does fails in :mod:`tracing.export_marks`): export keeps
    no trace of the block but its values' inference-ness, and the graph's values would
    be plain tensors (requiring grads); a tier that runs forward itself reproduces it."""
    if torch.is_inference_mode_enabled():
        return  # the whole call is in inference mode: the block changes nothing
    for node in graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.is_inference():
            raise InferenceModeError(
                f"{node.name} is computed in a `torch.inference_mode()` block of forward, "
                "which torch.export does not record"
            )


def _export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    seen: tuple[LeafShapes, ...],
) -> tuple[Any, Marks]:
    """Export with the dimensions that varied over ``seen`` free (``Dim.AUTO``): torch.export
    keeps dynamic what the model lets vary and specializes the rest, so one export serves
    every shape its guards allow. Only those dimensions: each free dimension's sizes enter
    the symbolic shapes of every op after it, and a model that computes paddings or patch
    counts from the image size (timm's TF "same" convolutions, MobileViT's unfold) spends
    minutes in sympy when H and W are free but only the batch changed. With nothing
    ``seen``, or when the dynamic export fails on something else than the model's
    data-dependent control flow (an input structure ``dynamic_shapes`` cannot describe),
    the export is static, once per shape."""
    if not seen:
        with marking(model) as marks:
            return torch.export.export(model, args, kwargs, strict=False), marks
    try:
        try:
            with marking(model) as marks:
                dynamic = _dynamic_shapes(model, args, kwargs, seen)
                ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic, strict=False)
        finally:
            # A failed export leaves its dynamic-dimension marks on the inputs: the static
            # export would read them and fail alike (timm's CPUBone took the dynamic tier),
            # and so would the user's own torch.compile of these tensors.
            for leaf in tree_flatten((args, kwargs))[0]:
                if isinstance(leaf, torch.Tensor):
                    clear_dimension_marks(leaf)
    except Exception as error:
        if "data-dependent" in str(error):
            raise  # the model's own control flow: a static export fails alike
        # Each attempt has its own module-call marks: a failed one leaves none behind.
        with marking(model) as marks:
            ep = torch.export.export(model, args, kwargs, strict=False)
    return ep, marks


def _dynamic_shapes(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    seen: tuple[LeafShapes, ...],
) -> dict[str, Any]:
    """``Dim.AUTO`` for each tensor dimension that varied, by ``forward``'s parameter names."""
    varying = _varying_dims(args, kwargs, seen)
    bound = inspect.signature(model.forward).bind_partial(*args, **kwargs)
    return {name: _auto_dims(value, varying) for name, value in bound.arguments.items()}


def _varying_dims(
    args: tuple[Any, ...], kwargs: dict[str, Any], seen: tuple[LeafShapes, ...]
) -> dict[int, tuple[int, ...]]:
    """By the ``id`` of each tensor of this call: its dimensions whose size differs from
    one of ``seen`` (every dimension where a shape seen has another rank)."""
    varying: dict[int, set[int]] = {}
    for index, leaf in enumerate(tree_flatten((args, kwargs))[0]):
        if not isinstance(leaf, torch.Tensor):
            continue
        shape = tuple(leaf.shape)
        before = [s[index] if index < len(s) else None for s in seen]
        dims = varying.setdefault(id(leaf), set())
        for b in before:
            if b is None or len(b) != len(shape):
                dims.update(range(len(shape)))
            else:
                dims.update(d for d, size in enumerate(shape) if b[d] != size)
    return {key: tuple(sorted(dims)) for key, dims in varying.items()}


def _auto_dims(value: Any, varying: dict[int, tuple[int, ...]]) -> Any:
    if isinstance(value, torch.Tensor):
        return {i: torch.export.Dim.AUTO for i in varying.get(id(value), ())} or None
    if isinstance(value, list | tuple):
        return type(value)(_auto_dims(v, varying) for v in value)
    # A dict subclass registered on its own (a ModelOutput such as the encoder_outputs of
    # an encoder-decoder's step) takes the spec of its flattened children, as a cache does.
    if type(value) is dict or type(value) is OrderedDict:
        return {k: _auto_dims(v, varying) for k, v in value.items()}
    children = pytree_children(value)  # a cache: the spec follows its flattened children
    if children is None:
        return None
    # A cache's int leaf is a per-step counter (``_compat`` lifts it): dynamic as a size.
    return [torch.export.Dim.AUTO if type(c) is int else _auto_dims(c, varying) for c in children]


def _infos(
    graph: fx.Graph,
    namer: PointNamer,
    root_type: str,
    weight_kind: dict[str, tuple[str, str]],
    marked: dict[fx.Node, list[Mark]],
    marks: Marks,
) -> dict[str, NodeInfo]:
    # Module calls are named first, in call order: the k-th call of a module is <path>_<k>.
    calls = [namer.module_output(path) for path in marks.calls]
    infos: dict[str, NodeInfo] = {}
    for node in graph.nodes:
        stack = module_stack(node)
        if node.op == "output":
            infos[node.name] = NodeInfo("output", NodeKind.OUTPUT, "output")
            continue
        if node.op == "placeholder":
            name = namer.input(node.name)
            infos[node.name] = NodeInfo(name, NodeKind.INPUT, "input", target=str(node.target))
            continue
        names = [name for m in marked.get(node, ()) for name in _mark_names(m, calls, marks)]
        if node.op == "get_attr":
            op, target = weight_kind.get(node.name, ("constant", str(node.target)))
            # A weight read only inside built-in modules (conv, linear) is not a point of
            # the fx graph either; keep those read by the user's own code.
            if not names and all(inside_leaf(stacks) for stacks in map(module_stack, node.users)):
                continue
            infos[node.name] = NodeInfo(
                namer.state(target), NodeKind.CONSTANT, op, target=target,
                aliases=tuple(names), module_output=bool(names),
            )  # fmt: skip
            continue
        raw, module_type = (stack[-1][1], stack[-1][2]) if stack else ("", root_type)
        op = function_op(node.target)
        leaf = _leaf_output(node, stack, marked, marks)
        module_output = leaf is not None or bool(names)
        if leaf is not None:
            name, op = (
                names.pop(names.index(_mark_names(leaf, calls, marks)[0])),
                module_type.lower(),
            )
        elif node.meta.get(RETURNED) and names:
            name = names.pop(0)  # a view put only to hold the module's value: no op point
        else:
            name = namer.op(raw, op)[0]
        infos[node.name] = NodeInfo(
            name=name, kind=NodeKind.OP, op=op, module=namer.path(raw), module_type=module_type,
            target=target_name(node.target),
            source=source_from_stack_trace(node.meta.get("stack_trace")), aliases=tuple(names),
            module_output=module_output,
        )  # fmt: skip
    return infos


def _mark_names(mark: Mark, calls: list[str], marks: Marks) -> list[str]:
    """The point names of a marked value: ``<path>`` on the first element, ``<path>:<k>``."""
    first = bool(mark.suffix) and marks.elements[mark.call][0] == mark.suffix
    return list(element_names(calls[mark.call], mark.suffix, first))


def _leaf_output(
    node: fx.Node,
    stack: list[tuple[str, str, str, str]],
    marked: dict[fx.Node, list[Mark]],
    marks: Marks,
) -> Mark | None:
    """The first element of a built-in module's call that ``node`` computes, if any."""
    if not stack or not is_leaf_type_name(stack[-1][3]):
        return None
    for mark in marked.get(node, ()):
        first = marks.elements[mark.call][0] == mark.suffix
        if first and marks.calls[mark.call] == stack[-1][1]:
            return mark
    return None


def module_stack(node: fx.Node) -> list[tuple[str, str, str, str]]:
    """(key, path, class name, qualified class) of each module call around ``node``, root excluded."""
    stack = node.meta.get("nn_module_stack") or {}
    found = []
    for key, (path, cls) in stack.items():
        if path:
            qualified = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
            found.append((key, path, qualified.rsplit(".", 1)[-1], qualified))
    return found


def inside_leaf(stack: list[tuple[str, str, str, str]]) -> bool:
    return any(is_leaf_type_name(entry[3]) for entry in stack)
