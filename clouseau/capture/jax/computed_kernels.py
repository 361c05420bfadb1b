"""Fused attention on JAX: ``jax.nn.dot_product_attention`` as one kernel node, with its options.

``jax.nn.dot_product_attention`` is a plain function (swapped by identity for the trace,
as :mod:`~clouseau.capture.jax.activations` swaps the activations); a call is traced
through a ``jax.jit`` named :data:`KERNEL_MARK` ``<i>``, and the options of call ``i``
(its scale, causality, which input is its bias or boolean mask) become the attrs of
its IR node, the ones :mod:`clouseau.ir.computed_attention` computes a pattern from.
The kernel itself runs unchanged (cuDNN's or XLA's; its ops are nodes as before), so the outputs stay bitwise.
Its layout is ``[batch, pos, head, d_head]`` (attr ``layout="bshd"``), grouped-query key
heads with ``head // (heads // kv_heads)`` as their key head.

A call with options the pattern cannot reproduce (sequence lengths, a local window, both
a bias and a mask, ``q``/``k``/``v`` passed by keyword) is traced as before, inlined:
its softmax, where the implementation has one, is the model's own pattern.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from clouseau.ir.graph import AttrValue

#: The jit name of a marked kernel call: ``KERNEL_MARK`` + the call's index in the trace.
KERNEL_MARK = "__clouseau_kernel_"
#: The ``jax.nn`` functions marked as kernels (swapped with the activations).
KERNELS = ("dot_product_attention",)
#: The options no computed pattern reproduces: such a call stays inlined.
_UNSUPPORTED = ("query_seq_lengths", "key_value_seq_lengths", "local_window_size")

Attrs = tuple[tuple[str, AttrValue], ...]
_local = threading.local()


@contextmanager
def recording(found: list[tuple[str, Attrs]]) -> Iterator[None]:
    """Record the kernel calls of one trace in ``found`` (op, attrs), in call order."""
    _local.found = found
    try:
        yield
    finally:
        _local.found = None


def call(
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    arrays: tuple[Any, ...],
    marked: Callable[[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any],
) -> Any:
    """Call the kernel ``name`` through ``marked`` (a jit named for it), else inlined.

    ``arrays`` are the array leaves of ``(args, kwargs)``, the kernel node's inputs.
    """
    found = getattr(_local, "found", None)
    attrs = kernel_attrs(fn, args, kwargs, arrays) if found is not None else None
    if found is None or attrs is None:
        return fn(*args, **kwargs)
    found.append((name, attrs))
    return marked(f"{KERNEL_MARK}{len(found) - 1}", fn, args, kwargs)


def kernel_attrs(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], arrays: tuple[Any, ...]
) -> Attrs | None:
    """A ``dot_product_attention`` call's options as IR attrs (None: not reproducible)."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    given = bound.arguments
    if len(args) < 3 or any(given.get(n) is not None for n in _UNSUPPORTED):
        return None
    if given.get("return_residual") or (given["bias"] is not None and given["mask"] is not None):
        return None
    extra = given["bias"] if given["bias"] is not None else given["mask"]
    mask = -1 if extra is None else next((i for i, a in enumerate(arrays) if a is extra), -2)
    scale = given["scale"]
    if mask == -2 or not (scale is None or isinstance(scale, int | float)):
        return None
    return (
        ("scale", None if scale is None else float(scale)),
        ("is_causal", bool(given["is_causal"])),
        ("mask", mask),
        ("dropout_p", 0.0),
        ("layout", "bshd"),
    )
