"""Intervention actions: what an intervene node does to the value at its point.

An :class:`Action` is framework-free: its arithmetic uses the operators torch tensors and
JAX arrays share (``*``, ``+``) and, for the rest, an :class:`ArrayOps` that each frontend
supplies (zeros, clip, batch mean, seeded noise, constants of the value's dtype and
device). The IR keeps only :meth:`Action.describe`; the callable or capture an action
holds (``payload``) lives in the side table of :func:`clouseau.ir.interventions.rewrite`.

>>> import clouseau
>>> clouseau.scale(0.5).describe()
'scale(0.5)'
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from dataclasses import replace as _with
from typing import Any, Protocol

from clouseau.ir.errors import SelectionError
from clouseau.ir.graph import AttrValue, TensorSpec


class ActionKind(enum.Enum):
    ZERO = "zero"
    SCALE = "scale"
    ADD = "add"
    CLAMP = "clamp"
    NOISE = "noise"
    MEAN_ABLATE = "mean_ablate"
    REPLACE = "replace"
    PATCH = "patch"


class ArrayOps(Protocol):
    """The few array operations an action needs that torch and JAX spell differently."""

    def zeros_like(self, value: Any) -> Any: ...

    def clip(self, value: Any, lo: float | None, hi: float | None) -> Any: ...

    def batch_mean(self, value: Any) -> Any:
        """The mean over axis 0, broadcast back to ``value``'s shape."""
        ...

    def normal(self, value: Any, seed: int) -> Any:
        """Standard normal noise of ``value``'s shape and dtype, the same for a given seed."""
        ...

    def constant(self, array: Any, like: Any) -> Any:
        """``array`` (numpy, torch, jax) as ``like``'s dtype and device, broadcast to its shape."""
        ...


@dataclass(frozen=True)
class Action:
    """One intervention. Build it with :func:`zero`, :func:`scale`, ... :func:`patch`.

    ``args`` are the printable parameters; ``payload`` is what cannot be printed or
    serialised (a function, a capture, an array), kept out of equality and the IR.
    """

    kind: ActionKind
    args: tuple[tuple[str, AttrValue], ...] = ()
    payload: Any = field(default=None, compare=False, hash=False, repr=False)

    def arg(self, name: str, default: AttrValue = None) -> AttrValue:
        return dict(self.args).get(name, default)

    def describe(self) -> str:
        """The action as the graph printer shows it: ``scale(0.5)``, ``patch(capture)``."""
        shown = [
            _show(v) if k in _POSITIONAL else f"{k}={_show(v)}"
            for k, v in self.args
            if v is not None
        ]
        if self.kind is ActionKind.REPLACE:
            shown = [getattr(self.payload, "__name__", type(self.payload).__name__)]
        elif self.payload is not None and self.kind in (ActionKind.PATCH, ActionKind.MEAN_ABLATE):
            shown.insert(0, "capture")
        elif self.payload is not None and self.kind is ActionKind.ADD:
            shown.insert(0, _describe_array(self.payload))
        return f"{self.kind.value}({', '.join(shown)})"

    def bind(self, names: tuple[str, ...], spec: TensorSpec) -> Action:
        """The action for one point: a capture is read now, so a wrong name fails at trace.

        Parameters
        ----------
        names
            The point's names (node name first, then module aliases).
        spec
            The point's shape and dtype; a patched or mean value must broadcast to it.
        """
        if self.kind is ActionKind.PATCH:
            target = self.arg("name")
            array = _read(self.payload, (str(target),) if target else names, self.arg("call"))
        elif self.kind is ActionKind.MEAN_ABLATE and self.payload is not None:
            array = _capture_mean(self.payload, names, self.arg("batch_axis"))
        else:
            return self
        shape = tuple(getattr(array, "shape", ()))
        if not _broadcasts(shape, spec.shape):
            raise SelectionError(
                f"{self.kind.value} at {names[0]!r}: the capture holds shape {shape}, "
                f"which does not broadcast to the point's shape {spec.shape}"
            )
        return _with(self, payload=_Bound(array))

    def apply(self, value: Any, ops: ArrayOps) -> Any:
        """The new value of the point (called by the lowered model on every call)."""
        kind = self.kind
        if kind is ActionKind.ZERO:
            return ops.zeros_like(value)
        if kind is ActionKind.SCALE:
            return value * self.arg("k")
        if kind is ActionKind.ADD:
            return value + (
                self.arg("v") if self.payload is None else ops.constant(self.payload, value)
            )
        if kind is ActionKind.CLAMP:
            return ops.clip(value, self.arg("lo"), self.arg("hi"))  # type: ignore[arg-type]
        if kind is ActionKind.NOISE:
            return value + ops.normal(value, int(self.arg("seed"))) * self.arg("std")  # type: ignore[arg-type]
        if kind is ActionKind.REPLACE:
            return _checked(self.payload(value), value)
        if isinstance(self.payload, _Bound):  # patch, or mean_ablate over a capture
            return ops.constant(self.payload.array, value)
        if kind is ActionKind.MEAN_ABLATE and self.payload is None:
            return ops.batch_mean(value)
        raise SelectionError(f"{self.describe()} was not bound to a point before use")


@dataclass(frozen=True, eq=False)
class _Bound:
    """A capture's array, read for one point."""

    array: Any


_POSITIONAL = frozenset({"k", "v"})


def _show(value: AttrValue) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _describe_array(array: Any) -> str:
    shape = tuple(getattr(array, "shape", ()))
    return f"<array {getattr(array, 'dtype', '?')}[{','.join(map(str, shape))}]>"


def _checked(new: Any, old: Any) -> Any:
    # Later ops were traced for the old shape; a different one would fail far from here.
    if tuple(getattr(new, "shape", ())) != tuple(old.shape):
        raise ValueError(
            f"replace(fn): fn returned shape {tuple(getattr(new, 'shape', ()))}, "
            f"but the point has shape {tuple(old.shape)}"
        )
    return new


def _read(capture: Any, names: tuple[str, ...], call: AttrValue) -> Any:
    for name in names:
        if name in capture:
            if call is not None:
                return capture.get(name, call=call)
            # A Capture stacks several calls on a new first axis: patching needs one call.
            calls = capture.calls_of(name) if hasattr(capture, "calls_of") else (0,)
            if len(calls) > 1:
                raise SelectionError(
                    f"patch: the capture holds {name!r} from {len(calls)} calls "
                    f"{list(calls)[:5]}; pick one with patch(capture, call=k)"
                )
            return capture[name]
    raise SelectionError(
        f"patch: the capture holds none of {list(names)}; it has {list(capture)[:10]}... "
        "(save the point in the capture you patch from, or pass patch(capture, name=...))"
    )


def _capture_mean(capture: Any, names: tuple[str, ...], batch_axis: AttrValue) -> Any:
    # Array methods and operators only: the IR imports no array library.
    name = next((n for n in names if n in capture), None)
    if name is None:
        _read(capture, names, None)  # raises the error that names the fix
    arrays = capture.all_calls(name) if hasattr(capture, "all_calls") else [capture[name]]
    if batch_axis is None:
        return sum(a.astype("float64") for a in arrays) / len(arrays)
    axis = int(batch_axis)  # type: ignore[arg-type]
    total = sum(a.astype("float64").sum(axis=axis, keepdims=True) for a in arrays)
    return total / sum(a.shape[axis] for a in arrays)


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target`` (numpy's rule, right-aligned)."""
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(shape[::-1], target[::-1], strict=False))


# --- the constructors (re-exported as clouseau.zero, clouseau.scale, ...) -------------


def zero() -> Action:
    """Replace the value by zeros (zero ablation).

    Returns
    -------
    Action
        For ``clouseau.instrument(model, intervene={pattern: clouseau.zero()})``.
    """
    return Action(ActionKind.ZERO)


def scale(k: float) -> Action:
    """Multiply the value by ``k``.

    Parameters
    ----------
    k
        The factor (a Python number, so the value keeps its dtype).
    """
    return Action(ActionKind.SCALE, (("k", float(k)),))


def add(v: Any) -> Action:
    """Add ``v`` to the value: a number, or an array (numpy, torch, jax) that broadcasts.

    Parameters
    ----------
    v
        A number, or an array converted to the value's dtype and device on every call
        (a steering vector, for example).
    """
    if isinstance(v, int | float) and not isinstance(v, bool):
        return Action(ActionKind.ADD, (("v", float(v)),))
    return Action(ActionKind.ADD, payload=v)


def clamp(lo: float | None = None, hi: float | None = None) -> Action:
    """Clip the value to ``[lo, hi]`` (either bound may be None).

    Parameters
    ----------
    lo, hi
        The bounds; at least one is needed.
    """
    if lo is None and hi is None:
        raise ValueError("clamp() needs a lower or an upper bound")
    return Action(ActionKind.CLAMP, (("lo", _opt_float(lo)), ("hi", _opt_float(hi))))


def noise(std: float, seed: int = 0) -> Action:
    """Add Gaussian noise of standard deviation ``std``, drawn from ``seed``.

    The noise is the same on every call (the seed is fixed), and depends on the
    framework's generator: torch and JAX draw different noise for one seed.

    Parameters
    ----------
    std
        Standard deviation of the noise.
    seed
        Seed of the framework's random generator.
    """
    return Action(ActionKind.NOISE, (("std", float(std)), ("seed", int(seed))))


def mean_ablate(capture: Mapping[str, Any] | None = None, *, batch_axis: int | None = 0) -> Action:
    """Replace the value by its mean over the batch, or over a capture of other inputs.

    Parameters
    ----------
    capture
        None: the mean over axis 0 of the value in this call (the batch of a torch model;
        a JAX model called on one example has no batch axis, give it a capture). A
        :class:`clouseau.Capture` (or a mapping of name -> array) that saved this point:
        the mean over every example it holds, fixed at trace time.
    batch_axis
        With a capture: the axis the examples lie along in each saved array (the arrays of
        all calls are joined along it); None when each call saved one example.
    """
    if capture is None and batch_axis is None:
        raise ValueError(
            "mean_ablate() without a capture takes the mean over axis 0 (batch_axis=0)"
        )
    return Action(ActionKind.MEAN_ABLATE, (("batch_axis", batch_axis),), payload=capture)


def replace(fn: Callable[[Any], Any]) -> Action:
    """Replace the value by ``fn(value)`` (any function of the value, same shape).

    Parameters
    ----------
    fn
        Called with the framework's tensor (torch) or array (JAX, possibly a tracer) on
        every call of the model; it must return the same shape.
    """
    if not callable(fn):
        raise TypeError(f"replace() takes a function of the value, not {type(fn).__name__}")
    return Action(ActionKind.REPLACE, payload=fn)


def patch(
    capture: Mapping[str, Any], name: str | None = None, *, call: int | None = None
) -> Action:
    """Activation patching: use the value recorded at this point (or at ``name``) in ``capture``.

    Parameters
    ----------
    capture
        A :class:`clouseau.Capture` (e.g. of a run on another input) or a mapping of
        name -> array; it must hold the point, with a shape that broadcasts to it.
    name
        Read this point of the capture instead of the intervened point's own names.
    call
        The call of the capture to read, when it holds several.
    """
    return Action(ActionKind.PATCH, (("name", name), ("call", call)), payload=capture)


def _opt_float(value: float | None) -> float | None:
    return None if value is None else float(value)
