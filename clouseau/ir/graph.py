"""The framework-neutral graph: values, nodes, modules and the points a user can select.

A :class:`Graph` is an immutable, topologically ordered tuple of :class:`Node`. Each node
produces zero or more values; a value is addressed by a :class:`Ref` (node name, output
index). A *point* is a tensor value with a name a user can type: the node's name (with
``:i`` appended for the i-th output of a multi-output node) and any aliases, such as the
module path of the module whose output the value is.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

AttrValue = str | int | float | bool | None | tuple["AttrValue", ...]


class DType(enum.Enum):
    """Element types, spelled as numpy spells them (``bfloat16`` via ml_dtypes)."""

    BOOL = "bool"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT8_E4M3FN = "float8_e4m3fn"
    FLOAT8_E5M2 = "float8_e5m2"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    COMPLEX64 = "complex64"
    COMPLEX128 = "complex128"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def short(self) -> str:
        """Compact spelling used by the printer: ``f32``, ``bf16``, ``i64``."""
        return _SHORT[self]


_ITEMSIZE = {
    DType.BOOL: 1, DType.UINT8: 1, DType.INT8: 1, DType.FLOAT8_E4M3FN: 1, DType.FLOAT8_E5M2: 1,
    DType.UINT16: 2, DType.INT16: 2,
    DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.UINT32: 4, DType.INT32: 4, DType.FLOAT32: 4,
    DType.UINT64: 8, DType.INT64: 8, DType.FLOAT64: 8, DType.COMPLEX64: 8, DType.COMPLEX128: 16,
}  # fmt: skip
_SHORT = {
    DType.BOOL: "b1", DType.UINT8: "u8", DType.UINT16: "u16", DType.UINT32: "u32",
    DType.UINT64: "u64", DType.INT8: "i8", DType.FLOAT8_E4M3FN: "f8e4m3",
    DType.FLOAT8_E5M2: "f8e5m2", DType.INT16: "i16", DType.INT32: "i32",
    DType.INT64: "i64", DType.FLOAT16: "f16", DType.BFLOAT16: "bf16", DType.FLOAT32: "f32",
    DType.FLOAT64: "f64", DType.COMPLEX64: "c64", DType.COMPLEX128: "c128",
}  # fmt: skip


@dataclass(frozen=True)
class TensorSpec:
    """Shape and element type of a tensor value.

    ``shape`` is the shape seen when the graph was traced; ``symbols`` (empty, or one
    string per dimension) names the dimensions that may change from call to call
    (``"s0"``, ``"2*s1"``), ``""`` for the fixed ones. Saved arrays keep their own
    concrete shapes.
    """

    shape: tuple[int, ...]
    dtype: DType
    # Not part of equality: two specs of one shape and dtype describe the same values.
    symbols: tuple[str, ...] = field(default=(), compare=False)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        dims = (
            [sym or str(d) for sym, d in zip(self.symbols, self.shape, strict=True)]
            if self.symbols
            else map(str, self.shape)
        )
        return f"{self.dtype.short}[{','.join(dims)}]"

    @property
    def dynamic(self) -> bool:
        """Whether some dimension may change from call to call."""
        return any(self.symbols)


@dataclass(frozen=True)
class OpaqueSpec:
    """A value that is not a tensor (an int from ``x.size(0)``, a tuple, None)."""

    type_name: str

    def __str__(self) -> str:
        return self.type_name


Spec = TensorSpec | OpaqueSpec


class NodeKind(enum.Enum):
    INPUT = "input"
    CONSTANT = "constant"  # a parameter, buffer or literal read by the graph
    OP = "op"  # a call of a function, method or leaf module
    SAVE = "save"  # inserted by passes.insert_saves: write the input value to the capture
    # inserted by interventions.insert_interventions: the value every later node reads
    # instead of its input (the action is the attr "action"; the callable in a side table)
    INTERVENE = "intervene"
    # inserted by interventions.insert_grad_saves: write d(loss)/d(input) when the user
    # runs backward (torch) or differentiates the model (JAX)
    SAVE_GRAD = "save_grad"
    OUTPUT = "output"


#: A node attribute: the node's value changes between iterations of a loop (a loop carry,
#: a slice, a loop's results) or between calls (state the model assigns: a BatchNorm
#: statistic, an RNG counter), so what is computed from it is an activation.
VARIES = "varies"

# Nodes that rewrite passes add: none of them is a point a user can select.
INSTRUMENTATION = frozenset({NodeKind.SAVE, NodeKind.INTERVENE, NodeKind.SAVE_GRAD})


class TraceKind(enum.Enum):
    """How a graph was traced: which tracer of which framework produced it.

    The values are the strings stored in graph files; they never change.
    """

    TORCH_FX = "torch.fx"
    TORCH_EXPORT = "torch.export"
    TORCH_DYNAMO = "torch.dynamo"  # one graph per region between Dynamo's graph breaks
    TORCH_HOOKS = "torch.hooks"  # module outputs through forward hooks, no trace
    JAX = "jax"


#: The name :class:`TraceKind` had before it said what it is; kept for code written then.
Frontend = TraceKind


@dataclass(frozen=True)
class Ref:
    """Output ``index`` of the node called ``node``."""

    node: str
    index: int = 0

    def __str__(self) -> str:
        return f"%{self.node}" if self.index == 0 else f"%{self.node}:{self.index}"


@dataclass(frozen=True)
class Source:
    """Where in the user's code a node was created."""

    file: str
    line: int
    function: str = ""
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


@dataclass(frozen=True)
class ModuleInfo:
    """A module (PyTorch submodule, Equinox/pytree node) of the traced model."""

    path: str  # dotted path, "" for the root
    type: str  # class name, e.g. "BasicBlock"
    params: int = 0  # parameters held by the module and its children


@dataclass(frozen=True)
class Node:
    """One operation of the graph.

    ``name`` is the node's point name (unique in the graph). ``aliases`` are extra point
    names for one of its outputs, as ``(output index, name)``; module outputs are aliases.
    ``key`` is the frontend's own id for the node (the fx node name, a jaxpr equation
    path), used only by the frontend that made it.
    """

    name: str
    kind: NodeKind
    op: str
    inputs: tuple[Ref, ...] = ()
    outputs: tuple[Spec, ...] = ()
    module: str = ""
    module_type: str = ""
    target: str = ""
    source: Source | None = None
    aliases: tuple[tuple[int, str], ...] = ()
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    subgraphs: tuple[Graph, ...] = ()
    key: str = ""

    def attr(self, name: str, default: AttrValue = None) -> AttrValue:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def names(self) -> tuple[str, ...]:
        """The point names a save, intervene or save_grad node stands for (its ``names``
        attribute); ``()`` on any other node."""
        names = self.attr("names")
        return tuple(str(n) for n in names) if isinstance(names, tuple) else ()

    def output_name(self, index: int) -> str:
        """Point name of output ``index``: the node name, with ``:i`` on multi-output nodes."""
        return self.name if len(self.outputs) == 1 else f"{self.name}:{index}"


@dataclass(frozen=True)
class Point:
    """A selectable tensor value: what ``select`` matches and what a capture stores."""

    name: str
    ref: Ref
    node: Node
    is_alias: bool = False

    @property
    def spec(self) -> TensorSpec:
        spec = self.node.outputs[self.ref.index]
        assert isinstance(spec, TensorSpec)
        return spec

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def exact_only(self) -> bool:
        """Selected only by a glob equal to its name (state and non-tensor values)."""
        return self.node.attr("point") == "exact"

    @property
    def module(self) -> str:
        return self.node.module

    @property
    def module_type(self) -> str:
        return self.node.module_type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape

    @property
    def dtype(self) -> DType:
        return self.spec.dtype


@dataclass(frozen=True)
class Graph:
    """A traced model: nodes in execution order, the modules they belong to, and meta data."""

    nodes: tuple[Node, ...]
    name: str = ""
    trace_kind: TraceKind = TraceKind.TORCH_FX
    modules: tuple[ModuleInfo, ...] = ()
    meta: tuple[tuple[str, AttrValue], ...] = field(default=())

    @property
    def frontend(self) -> TraceKind:
        """The old name of :attr:`trace_kind`, kept for code written before the rename."""
        return self.trace_kind

    @cached_property
    def _by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        """The node called ``name``; KeyError with close names when there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            from clouseau.ir.selection import closest

            raise KeyError(
                f"no node {name!r} in the graph; closest: {closest(name, self._by_name)}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def points(self) -> tuple[Point, ...]:
        """Every selectable tensor value, in execution order; aliases follow their node.

        Parameters, buffers and literals (CONSTANT nodes), and values computed from them
        alone (a transposed weight, a mask built from constants), are not points: they are
        the model's state, not its activations, and would be written again on every call.
        An op marked :data:`VARIES` (a loop carry) and what is computed from it, or from a
        constant marked :data:`VARIES` (state the call assigns), are points whatever their
        inputs: they change between iterations or calls.
        A module's output is a point all the same (attr ``module_output``): a module fed
        only by buffers (a position embedding), or one that returns a parameter itself
        (a bias it leaves to its caller), is still a module call a user selects. A
        frontend may make any value a point that only its exact name selects (attr
        ``point="exact"``, :attr:`Point.exact_only`): torch does so for parameters, buffers
        and non-tensor values, which torchvision's feature extraction names.
        """
        found: list[Point] = []
        for node in self.nodes:
            if node.kind in INSTRUMENTATION or node.kind is NodeKind.OUTPUT:
                continue
            exact = node.attr("point") == "exact"
            module_output = node.attr("module_output")
            if node.kind is NodeKind.CONSTANT and not (exact or module_output):
                continue
            if node.name in self._static and not (module_output or exact):
                continue
            for i, spec in enumerate(node.outputs):
                if isinstance(spec, TensorSpec):
                    found.append(Point(node.output_name(i), Ref(node.name, i), node))
            for i, alias in node.aliases:
                if isinstance(node.outputs[i], TensorSpec):
                    found.append(Point(alias, Ref(node.name, i), node, is_alias=True))
        return tuple(found)

    @cached_property
    def _static(self) -> frozenset[str]:
        """Nodes that depend on no input: constants and what is computed from them only."""
        static: set[str] = set()
        for node in self.nodes:
            if node.attr(VARIES, False):
                continue
            if node.kind is NodeKind.CONSTANT or (
                node.kind is NodeKind.OP and all(r.node in static for r in node.inputs)
            ):
                static.add(node.name)
        return frozenset(static)

    def names(self) -> tuple[str, ...]:
        """Every selectable point name, in execution order."""
        return tuple(p.name for p in self.points)

    @cached_property
    def _points_by_name(self) -> dict[str, Point]:
        return {p.name: p for p in self.points}

    def point(self, name: str) -> Point:
        try:
            return self._points_by_name[name]
        except KeyError:
            from clouseau.ir.selection import closest

            raise KeyError(
                f"no point {name!r}; closest: {closest(name, self._points_by_name)}"
            ) from None

    def module(self, path: str) -> ModuleInfo | None:
        return next((m for m in self.modules if m.path == path), None)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.kind is NodeKind.INPUT)

    @property
    def output(self) -> Node | None:
        return next((n for n in self.nodes if n.kind is NodeKind.OUTPUT), None)

    @property
    def saves(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.kind is NodeKind.SAVE)

    @property
    def interventions(self) -> tuple[Node, ...]:
        """The intervene nodes, in execution order."""
        return tuple(n for n in self.nodes if n.kind is NodeKind.INTERVENE)

    @property
    def grad_saves(self) -> tuple[Node, ...]:
        """The save_grad nodes, in execution order."""
        return tuple(n for n in self.nodes if n.kind is NodeKind.SAVE_GRAD)

    def meta_value(self, key: str, default: AttrValue = None) -> AttrValue:
        return dict(self.meta).get(key, default)

    def with_nodes(self, nodes: tuple[Node, ...]) -> Graph:
        return replace(self, nodes=nodes)

    def __str__(self) -> str:
        from clouseau.ir.printer import format_graph

        return format_graph(self)

    def to_pandas(self) -> Any:
        """One row per point: shape, dtype, module, parameters, FLOPs, source (needs pandas).

        See :func:`clouseau.ir.tables.points_frame`.
        """
        # Imported when asked for: ir.tables needs pandas, an optional extra.
        from clouseau.ir.tables import points_frame

        return points_frame(self)

    def summary(self, *, file: Any = None) -> None:
        """Print a table of the module tree with shapes, parameters and FLOPs (rich).

        See :func:`clouseau.ir.tables.summary`.
        """
        from clouseau.ir.tables import summary

        summary(self, file=file)

    def to_json(self) -> dict:
        from clouseau.ir.serialize import graph_to_json

        return graph_to_json(self)

    @staticmethod
    def from_json(data: dict) -> Graph:
        from clouseau.ir.serialize import graph_from_json

        return graph_from_json(data)
