"""The point names of one traced torch model, in the fx and the export path alike.

A module's output is named by its module path, and nothing else ever takes a module path:
every path of the model is reserved before the first node is named. An op is
``<module path>.<op>`` with torchvision's counter local to that prefix (fx's global
``_<n>`` suffix stripped, the next free counter appended). torchvision strips ``_<n>``
from module paths too (its name of ``ln_2``'s output is ``ln_1``); the fx path records
torchvision's own name as an extra alias wherever it names nothing else.

Module names that are not valid in point names (spaces, ``#``, ``%``, ``,``, ``:``, glob
characters, non-ASCII letters) are sanitised: each such character becomes ``_``, and a
path that then equals a valid path of the model or an earlier sanitised one gets the
first free ``_<k>`` (``k = 1, 2, ...``), in ``named_modules()`` order.

Op names: :class:`LocalNamer` is torchvision's counter local to a name (the
``torchvision_names`` meta, and a Dynamo region's ops in ``dynamic/stack.py``);
:func:`target_name` and :func:`function_op` name an fx call target.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from clouseau.capture.torch._compat import is_op_overload

_BAD = re.compile(r"[^A-Za-z0-9_\-]")
_SUFFIX = re.compile(r"(.+)_([0-9]+)$")


def clean_segment(segment: str) -> str:
    """One module name (or argument name) as a point-name segment."""
    return _BAD.sub("_", segment) or "_"


def clean_paths(paths: Iterable[str]) -> dict[str, str]:
    """Each raw dotted module path (``named_modules()``) -> its sanitised, unique path.

    A path that is valid as it is keeps itself; a sanitised one that equals a path already
    taken gets the first free ``_<k>``.
    """
    raws = list(dict.fromkeys(paths))
    found: dict[str, str] = {"": ""}
    found.update((raw, raw) for raw in raws if raw and _clean_path(raw) == raw)
    used = set(found.values())
    for raw in raws:
        if raw in found:
            continue
        parent, _, last = raw.rpartition(".")
        base = qualify(found.get(parent) or _clean_path(parent), clean_segment(last))
        path, k = base, 0
        while path in used:
            k += 1
            path = f"{base}_{k}"
        used.add(path)
        found[raw] = path
    return found


def _clean_path(raw: str) -> str:
    return ".".join(clean_segment(s) for s in raw.split(".")) if raw else ""


class _Counters:
    """Unique names with torchvision's ``_<n>`` counters that never take a reserved path."""

    def __init__(self, reserved: frozenset[str]) -> None:
        self.reserved = reserved
        self.given: set[str] = set()
        self.last: dict[str, int] = {}

    def module(self, path: str) -> str:
        """A module call's name: its path, then ``<path>_<k>`` for later calls."""
        return self._give(path) if path not in self.given else self._next(path)

    def exact(self, name: str) -> str:
        """``name`` itself where it is free (an input's argument name), else a counter."""
        taken = name in self.given or name in self.reserved
        return self._next(name) if taken else self._give(name)

    def op(self, qualname: str) -> str:
        match = _SUFFIX.match(qualname)
        base = match.group(1) if match else qualname
        if base in self.last or base in self.reserved or base in self.given:
            return self._next(base)
        return self._give(base)

    def kept(self, name: str) -> str:
        """``name`` itself where it is free (a name one region gave, across regions),
        else the next counter of its base, as :meth:`op`."""
        if name in self.given or name in self.reserved:
            return self.op(name)
        return self._give(name)

    def _next(self, base: str) -> str:
        k = self.last.get(base, 0) + 1
        while f"{base}_{k}" in self.given or f"{base}_{k}" in self.reserved:
            k += 1
        return self._give(f"{base}_{k}")

    def _give(self, name: str) -> str:
        self.given.add(name)
        self.last.setdefault(name, 0)
        match = _SUFFIX.match(name)
        if match:
            base, k = match.group(1), int(match.group(2))
            self.last[base] = max(self.last.get(base, 0), k)
        return name


class PointNamer:
    """Names the nodes of one trace of ``model``, in the order they are created."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.paths = clean_paths(p for p, _ in model.named_modules(remove_duplicate=False))
        self._names = _Counters(frozenset(self.paths.values()) - {""})
        self._torchvision = LocalNamer()
        self.calls: list[tuple[str, str]] = []  # (module path, name) of each module call
        # torchvision's names that are another module's path: (its name, clouseau's point).
        self.moved: list[tuple[str, str]] = []

    def path(self, raw: str) -> str:
        """The point-name form of the raw module path ``raw``."""
        found = self.paths.get(raw)
        return found if found is not None else _clean_path(raw)

    def input(self, argument: str) -> str:
        name = self._names.exact(clean_segment(argument))
        self._torchvision.reserve(name)
        return name

    def state(self, target: str) -> str:
        """A parameter, buffer or constant read by the model's own code: its dotted target."""
        return self._names.exact(_clean_path(target))

    def leaf(self, raw_path: str, name: str) -> str | None:
        """torchvision's name of a leaf module call named ``name``, where it differs."""
        return self._other(self._torchvision.name(self.path(raw_path)), name)

    def op(self, raw_path: str, local: str) -> tuple[str, str | None]:
        """An op ``local`` (fx node name or op name) inside ``raw_path``; and torchvision's name."""
        qualname = qualify(self.path(raw_path), clean_segment(local))
        name = self._names.op(qualname)
        return name, self._other(self._torchvision.name(qualname), name)

    def region(self, name: str, *, module: bool = False) -> str:
        """A name given in one region of a model (a TorchDynamo region, named on its own),
        made unique across its regions: kept where free, else the next ``_<k>`` of its
        base; ``module``: a module path (a module call or its alias), whose later calls
        are ``<path>_<k>``."""
        return self._names.module(name) if module else self._names.kept(name)

    def module_output(self, raw_path: str) -> str:
        """The name of a module call's output (the k-th call: ``<path>_<k>``); all module
        calls are named before any op, so that no op takes a name a later call needs."""
        path = self.path(raw_path)
        name = self._names.module(path)
        self.calls.append((path, name))
        return name

    @property
    def meta(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """Graph meta ``module_calls``: ``(module path, point name)`` per call, in order."""
        return ("module_calls", tuple(self.calls))

    @property
    def torchvision_meta(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """Graph meta ``torchvision_names``: ``(torchvision's name, point name)`` wherever
        torchvision's name of a value is another module's path (see :func:`torchvision_points`)."""
        return ("torchvision_names", tuple(self.moved))

    def _other(self, torchvision: str, name: str) -> str | None:
        # A module path always means that module's output, whatever torchvision says.
        if torchvision == name:
            return None
        if torchvision in self._names.reserved:
            self.moved.append((torchvision, name))
            return None
        return torchvision


def torchvision_points(graph: Any, names: Iterable[str]) -> list[str]:
    """The point holding ``create_feature_extractor``'s value for each torchvision name.

    torchvision strips ``_<n>`` from module paths as if it were its own counter, so some of
    its names are another module's path (in ``vit_b_16`` its ``...encoder_layer_0.ln_1`` is
    the output of ``ln_2``); in clouseau a module path always names its own module's output.
    This maps such names to clouseau's point of the same value and keeps every other name.

    Parameters
    ----------
    graph
        The fx-traced graph of the model (``clouseau.trace(model, x)`` or
        ``fmodel.trace(x)``); its meta ``torchvision_names`` lists the moved names.
    names
        torchvision's names (``get_graph_node_names(model)[1]``, or ``return_nodes``).

    Returns
    -------
    list[str]
        One point name per name, in order: ``select=`` takes them as they are.
    """
    moved = dict(graph.meta_value("torchvision_names", ()))
    return [moved.get(name, name) for name in names]


def element_names(name: str, suffix: str, first: bool) -> tuple[str, ...]:
    """The point names of one tensor element of a module call's output named ``name``.

    The one rule of every tier: the first tensor element (``suffix`` ``":0"``,
    ``":logits"``) is also named ``<name>``, the others only ``<name><suffix>``; a plain
    tensor output (``suffix`` ``""``) is ``<name>``.
    """
    if not suffix:
        return (name,)
    return (name, name + suffix) if first else (name + suffix,)


def element_paths(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(":<index or key>...", leaf)`` for each leaf of a module's output, in order.

    Tuples and lists are indexed (``:0``), mappings (dicts, ``ModelOutput``) and
    dataclasses keyed (``:logits``); ``None`` entries of a ``ModelOutput`` are absent.
    """
    for keys, leaf in element_keys(value):
        yield prefix + "".join(f":{clean_segment(str(k))}" for k in keys), leaf


def element_keys(value: Any, keys: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """``(keys, leaf)`` for each leaf of a module's output, in :func:`element_paths` order
    (the keys from the container down, which name the leaf)."""
    if isinstance(value, Mapping):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, tuple | list):
        items = enumerate(value)
    else:
        yield keys, value
        return
    for key, item in items:
        yield from element_keys(item, (*keys, key))


class LocalNamer:
    """Unique names with torchvision's local ``_<n>`` counters.

    torchvision strips fx's global ``_<n>`` suffix from a name, then looks for the latest
    name already given that equals it or equals it plus ``_<n>``, and appends the next
    counter. ``last`` holds, for each possible base, the counter of the latest name that
    matches it, so each lookup is O(1) instead of torchvision's scan over all names.
    """

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.given: set[str] = set()

    def name(self, qualname: str) -> str:
        """The name for ``qualname`` (``<module path>.<fx node name>`` or a module path)."""
        match = _SUFFIX.match(qualname)
        base = match.group(1) if match else qualname
        found = self.last.get(base)
        name = base if found is None else f"{base}_{found + 1}"
        self.reserve(name)
        return name

    def reserve(self, name: str) -> None:
        """Record ``name`` as given (inputs and constants named outside the scheme)."""
        self.given.add(name)
        self.last[name] = 0
        match = _SUFFIX.match(name)
        if match:
            self.last[match.group(1)] = int(match.group(2))


def free_name(name: str, taken: Iterable[str]) -> str:
    """``name`` where no point takes it, else the first free ``<name>_<k>``: the graph's
    own nodes (``input``, ``output``) yield to a module whose path is ``output``."""
    used = set(taken)
    found, k = name, 0
    while found in used:
        k += 1
        found = f"{name}_{k}"
    return found


def qualify(module_path: str, local: str) -> str:
    return f"{module_path}.{local}" if module_path else local


def is_leaf_class(cls: type) -> bool:
    """torch.fx's default leaf test: a torch.nn module other than ``nn.Sequential``."""
    module = cls.__module__ or ""
    builtin = module.startswith("torch.nn") or module.startswith("torch.ao.nn")
    return builtin and not issubclass(cls, torch.nn.Sequential)


def target_name(target: Any) -> str:
    """A printable qualified name of an fx call target: ``torch.flatten``, ``operator.add``."""
    if isinstance(target, str):
        return target
    if is_op_overload(target):
        return str(target)
    short = getattr(target, "__name__", "")
    for namespace, prefix in ((torch, "torch"), (torch.nn.functional, "torch.nn.functional")):
        if short and getattr(namespace, short, None) is target:
            return f"{prefix}.{short}"
    name = getattr(target, "__qualname__", None) or short or repr(target)
    module = getattr(target, "__module__", None)
    module = {"_operator": "operator"}.get(module, module)
    return f"{module}.{name}" if module else name


# Augmented assignment on a tensor (``x += y``) runs in place; its op is the plain op.
INPLACE_OPERATORS = {
    operator.iadd: "add", operator.isub: "sub", operator.imul: "mul",
    operator.itruediv: "truediv", operator.ifloordiv: "floordiv", operator.imod: "mod",
    operator.ipow: "pow", operator.imatmul: "matmul", operator.iand: "and_",
    operator.ior: "or_", operator.ixor: "xor", operator.ilshift: "lshift",
    operator.irshift: "rshift",
}  # fmt: skip


def function_op(target: Any) -> str:
    """The op of a call: ``add``, ``relu``, ``flatten``, ``getitem``; in-place ops as the op."""
    if isinstance(target, str):
        name = target
    elif target in INPLACE_OPERATORS:
        return INPLACE_OPERATORS[target]
    elif getattr(target, "overloadpacket", None) is not None:
        name = target.overloadpacket.__name__
    else:
        name = getattr(target, "__name__", None) or type(target).__name__
    # In-place methods and ATen ops (add_, relu_) are named after the op, as fx names "x += y".
    return name[:-1] if name.endswith("_") and not name.startswith("_") and len(name) > 1 else name
