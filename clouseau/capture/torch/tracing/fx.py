"""Trace with torch.fx, naming nodes as torchvision's ``get_graph_node_names`` (module
paths first: see :mod:`clouseau.capture.torch.naming.points`)."""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch._compat import (
    forward_hooks_of,
    forward_hooks_with_kwargs,
    set_in_order,
    user_forward_hooks,
)
from clouseau.capture.torch.naming.points import (
    INPLACE_OPERATORS,
    PointNamer,
    element_names,
    element_paths,
    function_op,
    target_name,
)
from clouseau.capture.torch.tracing.builtins import python_path
from clouseau.capture.torch.tracing.export_hooks import hooks_runner, run_hooks, set_aside
from clouseau.capture.torch.tracing.sources import source_from_stack
from clouseau.capture.torch.tracing.traced import (
    InputPicker,
    NodeInfo,
    Traced,
    bind,
    forward_signature,
    has_tensor,
    is_leaf,
    is_marked_leaf,
    name_tuple_elements,
)
from clouseau.ir.graph import NodeKind, Source, TraceKind


class InplaceProxy(fx.Proxy):
    """A proxy on which ``x += y`` records an in-place ``operator.iadd``.

    fx's Proxy has no ``__iadd__``, so Python runs ``x = x + y`` and the traced graph
    loses the mutation of ``x`` (and of every view of it) that eager mode performs. The
    node keeps the plain op's name (``add``), so names stay torchvision's.
    """


def _inplace_method(
    op: Callable[[Any, Any], Any], name: str
) -> Callable[[fx.Proxy, Any], fx.Proxy]:
    def method(self: fx.Proxy, other: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {}, name=name)

    return method


for _op, _name in INPLACE_OPERATORS.items():
    setattr(InplaceProxy, f"__{_op.__name__}__", _inplace_method(_op, _name))


# Random draws that take no tensor (fx sees no proxy in their arguments).
_RANDOM = ("rand", "randn", "randint", "randperm", "normal")


class NumericsStateError(RuntimeError):
    """The traced code changes global state that changes numerics, which fx cannot record."""


def numerics_state() -> tuple[Any, ...]:
    """The global modes under which ops run: grad, inference, autocast (per device type)."""
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        *((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")),
    )


class NamingTracer(fx.Tracer):
    """An fx tracer that records, for every node, its point name and module.

    ``_where`` is the (raw path, class name) of the innermost module being traced. A
    non-leaf module's output proxies are recorded in ``module_outputs`` so the IR can give
    each value the module's path as an alias: ``<path>`` for a single tensor, and for a
    tuple, list, dict or ``ModelOutput`` ``<path>:<index or key>`` per element (nested:
    ``<path>:1:0``) with ``<path>`` on the first. ``torchvision`` holds torchvision's
    own name of a node where it differs and names nothing else.
    """

    def __init__(self, model: torch.nn.Module, arguments: dict[str, Any]) -> None:
        super().__init__()
        self.arguments = arguments
        self._where = ("", type(model).__name__)
        self.namer = PointNamer(model)
        self.records: dict[fx.Node, tuple[str, str, str, Source | None]] = {}
        self.pending: dict[fx.Node, tuple[str, str, Source | None]] = {}
        # Module calls in the order they return: (raw path, leaf node or None, output,
        # the graph's last node when the call returned).
        self.calls: list[tuple[str, fx.Node | None, Any, fx.Node | None]] = []
        self.module_outputs: dict[fx.Node, list[str]] = {}
        self.torchvision: dict[fx.Node, str] = {}
        self.numerics = numerics_state()
        self.opaque_outputs: dict[str, str] = {}

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        # torch.rand(2, 3) has no proxy argument: fx would run it once and bake its value
        # (or a trip count drawn from it) into the graph. Record each draw as a node, so
        # every call draws anew, as eager does, and control flow on a draw fails to trace.
        originals = {name: getattr(torch, name) for name in _RANDOM}
        for name, fn in originals.items():
            setattr(torch, name, self._recorded(fn))
        try:
            return super().trace(root, concrete_args)
        finally:
            for name, fn in originals.items():
                setattr(torch, name, fn)

    def _recorded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def draw(*args: Any, **kwargs: Any) -> Any:
            if isinstance(kwargs.get("generator"), torch.Generator):
                return fn(*args, **kwargs)  # a user's generator cannot be a graph argument
            return self.create_proxy("call_function", fn, args, kwargs)

        return draw

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return InplaceProxy(node, self)

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return is_leaf(m)

    def call_module(
        self,
        m: torch.nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        path = self.path_of_module(m)
        # A built-in traced on its Python path (tracing/builtins.py) is no leaf here,
        # unless the user marked it one.
        through = None if is_marked_leaf(m) else python_path(m, args, kwargs)
        leaf = through is None and self.is_leaf_module(m, path)
        outer, self._where = self._where, (path, type(m).__name__)
        hooks = None if leaf or not user_forward_hooks(m) else dict(forward_hooks_of(m))
        try:
            if hooks is not None:  # traced through: the hooks would run once, on proxies
                set_aside(m, user_forward_hooks(m))
            out = (
                through(*args, **kwargs)
                if through
                else super().call_module(m, forward, args, kwargs)
            )
        finally:
            if hooks is not None:
                forward_hooks_of(m).clear()
                forward_hooks_of(m).update(hooks)
        try:
            if hooks is not None:  # named inside the module: <path>.forward_hooks
                out = self._hooks_node(m, args, kwargs, out)
        finally:
            self._where = outer
        if not leaf:
            self.calls.append((path, None, out, next(iter(reversed(self.graph.nodes)), None)))
        return out

    def _hooks_node(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> Any:
        """A node that runs ``module``'s forward hooks on every call, as ``__call__`` does
        (a leaf module's call node runs them by itself)."""
        if isinstance(out, fx.Proxy):
            try:
                target = hooks_runner(module)
                return self.create_proxy("call_function", target, (args, kwargs, out), {})
            except (NotImplementedError, TypeError):
                pass  # an argument fx cannot put in a graph (an arbitrary object)
        # An output that is not one traced value (a tuple), or arguments fx cannot hold:
        # the hooks run now, on the traced values, as torch.fx runs them by itself.
        return run_hooks(
            module, forward_hooks_of(module), set(forward_hooks_with_kwargs(module)),
            args, kwargs, out,
        )  # fmt: skip

    def name_nodes(self, graph: fx.Graph) -> None:
        """Name every node once the trace is complete: module calls first, in call order
        (so the k-th call of a module is named alike on both paths), then the ops."""
        namer = self.namer
        leaf_names: dict[fx.Node, str] = {}
        for path, node, out, end in self.calls:
            name = namer.module_output(path)
            if node is not None:
                leaf_names[node] = name
                continue
            found = module_output_names(name, out)
            for alias, proxy in found:
                returned = last_mutation(proxy.node, end)
                self.module_outputs.setdefault(returned, []).append(alias)
            if not found and out is not None:
                self.opaque_outputs.setdefault(namer.path(path), type(out).__name__)
        for node in graph.nodes:
            if node.op == "output":
                continue
            path, module_type, source = self.pending[node]
            other: str | None = None
            if node.op == "placeholder":
                name = namer.input(str(node.target))  # the argument, not fx's input_1
            elif node.op == "call_module":
                name = leaf_names[node]
                other = namer.leaf(path, name)
                name = self._tuple_elements(node, name)
            else:  # "<path>.<fx node name>" with a counter local to the name
                name, other = namer.op(path, node.name)
            if other is not None:
                self.torchvision[node] = other
            self.records[node] = (name, namer.path(path), module_type, source)

    def _tuple_elements(self, node: fx.Node, name: str) -> str:
        """A leaf call whose value is only indexed (a tuple): each element read is the point
        ``<path>:<index>``, the first also ``<path>``; the call itself is ``<path>:tuple``."""
        users = list(node.users)
        if not users or not all(
            u.target is operator.getitem and isinstance(u.args[1], int) for u in users
        ):
            return name
        for user in users:
            index = user.args[1]
            self.module_outputs.setdefault(user, []).extend(
                element_names(name, f":{index}", index == 0)
            )
        return f"{name}:tuple"

    def create_node(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> fx.Node:
        if numerics_state() != self.numerics:
            raise NumericsStateError(
                "forward changes autocast, grad or inference mode (a `with torch.autocast`, "
                "`torch.no_grad`, `enable_grad` or `inference_mode` block), which torch.fx "
                "does not record"
            )
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if kind != "output":
            path, module_type = self._where
            source = source_from_stack() if kind != "placeholder" else None
            self.pending[node] = (path, module_type, source)
            if kind == "call_module":
                self.calls.append((path, node, None, None))
        return node

    def create_arg(self, a: Any) -> Any:
        # fx cannot emit a dataclass instance (a model output such as ModelOutput); emit
        # a call of its constructor so the GraphModule returns the same type.
        if dataclasses.is_dataclass(a) and not isinstance(a, type):
            fields = {
                f.name: self.create_arg(getattr(a, f.name)) for f in dataclasses.fields(a) if f.init
            }
            built = self.create_node("call_function", type(a), (), fields)
            if not isinstance(a, OrderedDict):
                return built
            # A ModelOutput: the constructor orders the keys as its fields and drops those
            # set to None; forward's order is the one to_tuple() and positions read.
            items = tuple((k, self.create_arg(v)) for k, v in a.items())
            return self.create_node("call_function", in_key_order, (built, items), {})
        # fx emits every mapping as a plain dict literal, and a namedtuple or list
        # subclass as its base: rebuild the user's own container (torchvision's
        # segmentation models return an OrderedDict).
        if isinstance(a, dict) and type(a) is not dict:
            items = tuple((self.create_arg(k), self.create_arg(v)) for k, v in a.items())
            return self.create_node("call_function", type(a), (items,), {})
        return super().create_arg(a)

    def create_args_for_root(
        self, root_fn: Callable[..., Any], is_module: bool, concrete_args: Any = None
    ) -> tuple[Callable[..., Any], list[Any]]:
        # Tensor arguments become placeholders named like the parameter; every other
        # argument (None, ints, flags, configs) is passed as its value, so control flow on
        # it is resolved at trace time. The cache key of instrument() includes them.
        params = list(inspect.signature(root_fn).parameters.values())[1:]
        positional: list[Any] = []
        keyword: dict[str, Any] = {}
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"torch.fx cannot trace forward(*{p.name}) / forward(**{p.name})")
            value = self.arguments[p.name]
            if has_tensor(value):
                value = self.create_proxy("placeholder", p.name, (), {})
            if p.kind is p.KEYWORD_ONLY:
                keyword[p.name] = value
            else:
                positional.append(value)
        root = self.root

        def call() -> Any:
            return root_fn(root, *positional, **keyword)

        return call, []


def last_mutation(node: fx.Node, end: fx.Node | None) -> fx.Node:
    """The last in-place op on ``node``'s tensor up to ``end`` (the module's return), or
    ``node``: a module that returns ``x`` after ``x.add_(y)`` returns the value after it,
    which fx's graph holds only as the ``add_`` node (``x`` itself is the value before)."""
    chain, last, cur = {node}, node, node
    while cur is not end and cur.next.op != "root":
        cur = cur.next
        if cur.args and cur.args[0] in chain and _is_inplace(cur):
            chain.add(cur)
            last = cur
    return last


def in_key_order(out: OrderedDict[str, Any], items: tuple[tuple[str, Any], ...]) -> Any:
    """``out`` (a ``ModelOutput``) holding exactly ``items``, in their order."""
    set_in_order(out, items)
    return out


def _is_inplace(node: fx.Node) -> bool:
    if node.kwargs.get("inplace") is True:
        return True
    if node.op == "call_function" and node.target in INPLACE_OPERATORS:
        return True
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    is_function = node.op in ("call_method", "call_function")
    return is_function and isinstance(name, str) and name.endswith("_") and not name.startswith("_")


def module_output_names(name: str, out: Any) -> list[tuple[str, fx.Proxy]]:
    """``(alias, proxy)`` for each traced value a module call returned (see NamingTracer)."""
    if isinstance(out, fx.Proxy):
        return [(name, out)]
    leaves = [(suffix, leaf) for suffix, leaf in element_paths(out) if isinstance(leaf, fx.Proxy)]
    return [
        (alias, leaf)
        for position, (suffix, leaf) in enumerate(leaves)
        for alias in element_names(name, suffix, position == 0)
    ]


def tensor_params(arguments: dict[str, Any]) -> tuple[str, ...]:
    return tuple(name for name, value in arguments.items() if has_tensor(value))


def trace_fx(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Traced:
    """Trace ``model`` called with ``args``/``kwargs`` with torch.fx (names as torchvision)."""
    signature = forward_signature(model)  # once: binding runs on every call
    arguments = bind(model, args, kwargs, signature)
    tracer = NamingTracer(model, arguments)
    before = set(vars(model))
    try:
        graph = tracer.trace(model)
        tracer.name_nodes(graph)
    finally:
        # fx stores tensors created in forward as attributes of the root module; move them
        # out so tracing leaves the user's model as it was.
        constants = {k: vars(model).pop(k) for k in set(vars(model)) - before}
    root = {
        node.target: constants[node.target]
        if node.target in constants
        else _resolve(model, node.target)
        for node in graph.nodes
        if node.op in ("get_attr", "call_module")
    }
    gm = fx.GraphModule(root, graph, class_name=type(model).__name__)
    names = tensor_params(arguments)
    infos = {node.name: _info(model, tracer, node) for node in gm.graph.nodes}
    return Traced(
        gm=gm,
        frontend=TraceKind.TORCH_FX,
        infos=name_tuple_elements(gm.graph, infos),
        to_inputs=InputPicker(signature, names),
        from_outputs=lambda out: out,
        opaque_outputs=tuple(tracer.opaque_outputs.items()),
        meta=(tracer.namer.meta, tracer.namer.torchvision_meta),
    )


def _resolve(model: torch.nn.Module, target: str) -> Any:
    obj: Any = model
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


def _info(model: torch.nn.Module, tracer: NamingTracer, node: fx.Node) -> NodeInfo:
    if node.op == "output":
        return NodeInfo("output", NodeKind.OUTPUT, "output")
    name, path, module_type, source = tracer.records[node]
    outputs_of = tracer.module_outputs.get(node, ())
    aliases = (*outputs_of, *_present(tracer.torchvision.get(node)))
    common = {
        "name": name, "source": source, "aliases": aliases,
        "module_output": bool(outputs_of) or node.op == "call_module",
    }  # fmt: skip
    if node.op == "placeholder":
        return NodeInfo(kind=NodeKind.INPUT, op="input", target=str(node.target), **common)
    if node.op == "get_attr":
        value = _resolve_or_none(model, str(node.target))
        op = (
            "parameter"
            if isinstance(value, torch.nn.Parameter)
            else "buffer"
            if value is not None
            else "constant"
        )
        return NodeInfo(
            kind=NodeKind.CONSTANT,
            op=op,
            module=path,
            module_type=module_type,
            target=str(node.target),
            **common,
        )
    if node.op == "call_module":
        cls = type(model.get_submodule(str(node.target)))
        return NodeInfo(
            kind=NodeKind.OP, op=cls.__name__.lower(), module=path, module_type=cls.__name__,
            target=f"{cls.__module__}.{cls.__qualname__}", **common,
        )  # fmt: skip
    target = f"Tensor.{node.target}" if node.op == "call_method" else target_name(node.target)
    return NodeInfo(
        kind=NodeKind.OP,
        op=function_op(node.target),
        module=path,
        module_type=module_type,
        target=target,
        **common,
    )


def _present(name: str | None) -> tuple[str, ...]:
    return () if name is None else (name,)


def _resolve_or_none(model: torch.nn.Module, target: str) -> Any:
    try:
        return _resolve(model, target)
    except AttributeError:
        return None
