"""What a tracer (fx or export) hands to the IR builder and the lowering.

Both tracers produce a :class:`Traced`: a runnable ``torch.fx.GraphModule`` that reads the
model's live parameters through ``get_attr``, the IR facts of each of its nodes (name,
module, op, source) keyed by fx node name, and the adapters between the user's calling
convention and the GraphModule's positional inputs and outputs.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.fx as fx

from clouseau.capture.torch._compat import tree_leaves
from clouseau.capture.torch.naming.points import element_names, function_op, is_leaf_class
from clouseau.ir.graph import AttrValue, NodeKind, Source, TraceKind


@dataclass(frozen=True)
class NodeInfo:
    """The IR facts of one fx node; ``aliases`` are module paths whose output it is.

    ``module_output``: the node is a module call's output (a point even when it is
    computed from parameters, buffers and constants alone).
    """

    name: str
    kind: NodeKind
    op: str
    module: str = ""
    module_type: str = ""
    target: str = ""
    source: Source | None = None
    aliases: tuple[str, ...] = ()
    module_output: bool = False


@dataclass(frozen=True, eq=False)
class Traced:
    """A traced model. ``infos`` lacks nodes left out of the IR (export's weight inputs).

    ``accepts(args, kwargs)`` says whether a call whose structure matches the traced one
    (same pytree, dtypes, ranks) fits the graph too: an fx graph takes any shape (None), an
    exported one only the shapes its guards allow (a dimension it specialized on).
    """

    gm: fx.GraphModule
    frontend: TraceKind
    infos: Mapping[str, NodeInfo]
    to_inputs: Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]
    from_outputs: Callable[[Any], Any]
    meta: tuple[tuple[str, AttrValue], ...] = ()
    accepts: Callable[[tuple[Any, ...], dict[str, Any]], bool] | None = None
    # Module calls whose output holds no traced tensor: (module path, output type).
    opaque_outputs: tuple[tuple[str, str], ...] = ()


_LEAF_MODULES: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_LEAF_CLASSES: set[type] = set()


def mark_leaf(*modules: torch.nn.Module | type) -> None:
    """Trace these modules (instances or classes) as one node each, without entering them.

    Use it for a submodule whose code torch.fx cannot trace (data-dependent control flow
    on tensor values): the module runs as is and its output keeps its module-path name.

    Parameters
    ----------
    *modules
        ``nn.Module`` instances (e.g. ``model.encoder.layers[0].attn``) or classes.
    """
    for m in modules:
        if isinstance(m, type) and issubclass(m, torch.nn.Module):
            _LEAF_CLASSES.add(m)
        elif isinstance(m, torch.nn.Module):
            _LEAF_MODULES.add(m)
        else:
            raise TypeError(
                f"mark_leaf takes nn.Module instances or classes, not {type(m).__name__}"
            )


def is_leaf(module: torch.nn.Module) -> bool:
    """torch.fx's default leaf rule (built-in torch.nn modules), plus what mark_leaf marked."""
    return is_marked_leaf(module) or is_leaf_class(type(module))


def is_marked_leaf(module: torch.nn.Module) -> bool:
    """Whether :func:`mark_leaf` marked ``module`` or its class."""
    return module in _LEAF_MODULES or type(module) in _LEAF_CLASSES


def is_leaf_type_name(qualified: str) -> bool:
    """:func:`is_leaf` for torch.export's ``nn_module_stack`` class names."""
    if any(f"{c.__module__}.{c.__qualname__}" == qualified for c in _LEAF_CLASSES):
        return True
    builtin = qualified.startswith(("torch.nn.", "torch.ao.nn."))
    return builtin and qualified.rsplit(".", 1)[-1] not in ("Sequential",)


def forward_signature(model: torch.nn.Module) -> inspect.Signature:
    return inspect.signature(model.forward)


def bind(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    signature: inspect.Signature | None = None,
) -> dict[str, Any]:
    """The arguments of ``model.forward`` by parameter name, defaults applied."""
    bound = (signature or forward_signature(model)).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


class InputPicker:
    """``to_inputs`` of an fx-traced forward: its tensor arguments, in parameter order.

    ``inspect.Signature.bind`` costs tens of microseconds, a noticeable share of a small
    model's call. Where each input comes from (a position, a keyword, a default) depends
    only on the number of positional arguments and the keyword names, so it is worked out
    once per such call shape (:meth:`plan`) and reused.
    """

    def __init__(self, signature: inspect.Signature, names: tuple[str, ...]) -> None:
        self._signature = signature
        self._names = names
        self._plans: dict[tuple[int, tuple[str, ...]], _Picker] = {}

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        return self.plan(args, kwargs)(args, kwargs)

    def plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Picker:
        """The picker of calls shaped like this one (same count of positionals, same keywords)."""
        shape = (len(args), tuple(kwargs))
        picker = self._plans.get(shape)
        if picker is None:  # a race only computes the same plan twice
            picker = self._plans[shape] = self._make(args, kwargs)
        return picker

    def _make(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Picker:
        # Bind placeholders in place of the values: what lands where is the plan.
        positions = [_Position(i) for i in range(len(args))]
        keywords = {k: _Keyword(k) for k in kwargs}
        try:
            bound = self._signature.bind(*positions, **keywords)
        except TypeError:
            self._signature.bind(*args, **kwargs)  # the same error, naming the values
            raise
        bound.apply_defaults()
        sources = tuple(bound.arguments[name] for name in self._names)
        # By identity: a default value (a tensor) is not compared with ==.
        if len(sources) == len(positions) and all(map(operator.is_, sources, positions)):
            return _positional  # the common call: every argument a tensor, in order
        return partial(_pick, sources)


_Picker = Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]


@dataclass(frozen=True)
class _Position:
    index: int


@dataclass(frozen=True)
class _Keyword:
    name: str


def _positional(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    return args


def _pick(
    sources: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    # A source is a position, a keyword, or the parameter's default value itself.
    return tuple(
        args[s.index] if type(s) is _Position else kwargs[s.name] if type(s) is _Keyword else s
        for s in sources
    )


def has_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or any(
        isinstance(leaf, torch.Tensor) for leaf in tree_leaves(value)
    )


def canonical_kwargs(model: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` ordered as ``forward`` declares them, so a flattened call is stable."""
    if not kwargs:  # the signature lookup alone costs more than the rest of a call
        return kwargs
    order = {name: i for i, name in enumerate(forward_signature(model).parameters)}
    return dict(sorted(kwargs.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


# Ops that return a tuple (or list) of tensors, by torch, Tensor method and ATen name. The
# names say it, not the value: the names must not depend on a run (``x.size()`` is indexed
# alike, but its value is one point, torchvision's).
TUPLE_OPS = frozenset({
    "chunk", "split", "split_with_sizes", "tensor_split", "unsafe_chunk", "unsafe_split",
    "hsplit", "vsplit", "dsplit", "unbind", "topk", "max", "min", "sort", "kthvalue", "mode",
    "median", "nanmedian", "cummax", "cummin", "aminmax", "var_mean", "std_mean", "frexp",
    "meshgrid", "broadcast_tensors", "unique", "unique_consecutive", "histogram",
})  # fmt: skip


def name_tuple_elements(graph: fx.Graph, infos: Mapping[str, NodeInfo]) -> dict[str, NodeInfo]:
    """Name the elements of ops that return a tuple (``chunk``, ``split``, ``unbind``,
    ``topk``, ``max(dim)``, ``sort``) as a module's tuple elements are named: the element
    read by each ``getitem`` is ``<op>:<index>``, the first also ``<op>``, and the call
    itself ``<op>:tuple``. An op whose value is used otherwise than indexed keeps its name."""
    found = dict(infos)
    for node in graph.nodes:
        info = infos.get(node.name)
        if (
            info is None
            or node.op not in ("call_function", "call_method")
            or function_op(node.target) not in TUPLE_OPS
            or info.module_output
            or not node.users
            or not all(_indexes(user) for user in node.users)
        ):
            continue
        found[node.name] = dataclasses.replace(info, name=f"{info.name}:tuple")
        for user in node.users:
            element = found.get(user.name)
            if element is None:
                continue
            index = user.args[1]
            aliases = (*element.aliases, *element_names(info.name, f":{index}", index == 0))
            found[user.name] = dataclasses.replace(element, aliases=aliases)
    return found


def _indexes(user: fx.Node) -> bool:
    return user.target is operator.getitem and isinstance(user.args[1], int)
