"""The public functions of clouseau; ``clouseau/__init__.py`` re-exports them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from clouseau._explore import explore as _explore
from clouseau._explore import install_reprs
from clouseau.capture import frontend_for, frontend_named
from clouseau.distributed import adapt_to_engine, open_sink
from clouseau.ir.actions import Action
from clouseau.ir.graph import Graph
from clouseau.ir.interventions import check_intervene
from clouseau.ir.selection import SelectLike, check_select
from clouseau.store.layout import DEFAULT_PATTERN
from clouseau.store.remote import TIMEOUT_S

# Graph, Capture and DiffResult render as the explorer in notebooks, as tables in rich.
install_reprs()

DEFAULT_PATH = ".clouseau"


def trace(model: Any, *args: Any, **kwargs: Any) -> Graph:
    """Trace ``model`` called on example inputs into the IR.

    Parameters
    ----------
    model
        A ``torch.nn.Module``, a JAX function, or an Equinox module.
    *args, **kwargs
        Example inputs; shapes and dtypes of every node come from them.

    Returns
    -------
    Graph
        The IR: ``print(g)`` shows it, ``g.names()`` lists every selectable point.
    """
    return frontend_for(model, args).trace(model, *args, **kwargs)


def instrument(
    model: Any,
    select: SelectLike = "*",
    path: str | os.PathLike[str] | None = DEFAULT_PATH,
    max_size_mb: float = 1024,
    filename_pattern: str = DEFAULT_PATTERN,
    *,
    intervene: Mapping[Any, Action] | None = None,
    grads: bool | SelectLike = False,
    timeout_s: float = TIMEOUT_S,
) -> Any:
    """Compile ``model`` into a drop-in model that saves the selected activations.

    Parameters
    ----------
    model
        A ``torch.nn.Module``, a JAX function, or an Equinox module.
    select
        Which points to save: a glob (``"relu*"``, ``"layer1.*"``), a list of globs
        (``"!glob"`` excludes), a callable ``Point -> bool``, a :class:`Selector`, or
        ``None`` for nothing. See docs/selection.md.
    path
        The capture directory (created; an earlier capture in it is replaced), or
        ``None`` to keep the activations in memory (``fmodel.captured``).
    max_size_mb
        Files roll over at this size; an array is never split.
    filename_pattern
        File names, with an ``{idx}`` field numbering the rolled files.
    intervene
        ``{pattern: action}``: change the value at every point a pattern selects, so the
        rest of the model (and the save of that point) sees the new value. Actions:
        :func:`clouseau.zero`, :func:`~clouseau.scale`, :func:`~clouseau.add`,
        :func:`~clouseau.clamp`, :func:`~clouseau.noise`, :func:`~clouseau.mean_ablate`,
        :func:`~clouseau.replace`, :func:`~clouseau.patch`. See docs/interventions.md.
    grads
        ``True``: also save the gradient of every selected point, as ``<name>.grad`` in
        the same call, when the user runs ``loss.backward()`` (torch) or differentiates
        the model with ``jax.grad``; a glob (or any selection): the gradients of the
        points it selects.
    timeout_s
        For an fsspec URL ``path``: the limit in seconds on each remote call (the lock,
        an upload of one file), so that an endpoint that stops answering makes
        ``close()`` raise a ``CaptureError`` instead of blocking.

    Returns
    -------
    The instrumented model: same calling convention and outputs as ``model``; a context
    manager whose exit (or ``close()``) flushes everything to ``path``. It traces lazily
    on the first call of each input structure (PyTorch: dtypes, ranks, devices, train/eval,
    not sizes; JAX: per input signature, as ``jax.jit``); ``fmodel.trace(*args)`` traces
    eagerly.
    """
    frontend = frontend_for(model)
    # Bad arguments fail before the sink opens: opening it replaces an earlier capture.
    # The one check of select: the frontend's instrument takes it as checked.
    check_select(select)
    intervene = check_intervene(intervene)
    sink = open_sink(path, max_size_mb, filename_pattern, timeout_s=timeout_s)
    try:
        fmodel = frontend.instrument(
            model, select=select, sink=sink, intervene=intervene, grads=grads
        )
        adapt_to_engine(model, fmodel)
        return fmodel
    except BaseException:
        getattr(sink, "abandon", sink.close)()  # nothing was written: nothing changes
        raise


def backend(
    select: SelectLike = "*",
    path: str | os.PathLike[str] | None = DEFAULT_PATH,
    max_size_mb: float = 1024,
    filename_pattern: str = DEFAULT_PATTERN,
    *,
    compiler: Any = "inductor",
    intervene: Mapping[Any, Action] | None = None,
) -> Any:
    """A ``torch.compile`` backend that saves the selected activations of the compiled model.

    ``torch.compile(model, backend=clouseau.backend(select="relu*", path=".clouseau"))``
    instruments each graph TorchDynamo compiles (names as :func:`instrument` gives them)
    and compiles the instrumented graph with ``compiler``.

    Parameters
    ----------
    select, path, max_size_mb, filename_pattern, intervene
        As for :func:`instrument`.
    compiler
        The backend that compiles the instrumented graphs: ``"inductor"`` (the default,
        as ``torch.compile``'s), ``"aot_eager"``, ``"eager"``, or a backend callable.

    Returns
    -------
    clouseau.capture.torch.dynamic.backend.Backend
        Pass it as ``backend=``; a context manager whose exit (or ``close()``) flushes the
        capture, with ``captured`` and ``traces``. Each run of a compiled graph is one call.
    """
    torch = frontend_named("torch")  # MissingExtraError without torch
    check_select(select)
    intervene = check_intervene(intervene)
    sink = open_sink(path, max_size_mb, filename_pattern)
    try:
        return torch.backend(select, sink, compiler=compiler, intervene=intervene)
    except BaseException:
        sink.close()
        raise


def draw(
    source: Any, output: str | os.PathLike[str], select: SelectLike = None, **options: Any
) -> Any:
    """Draw a graph, an instrumented model or a capture directory to .pdf/.svg/.png/.dot."""
    from clouseau.exporters.graphviz import draw as _draw

    if isinstance(source, str | os.PathLike):
        # Read by the store: bounded, links and FIFOs refused, the graph verified.
        from pathlib import Path

        from clouseau.store.reader import graph_of

        source = graph_of(Path(source))
    return _draw(source, output, select=select, **options)


def export_onnx(
    model: Any,
    example_args: Any,
    output: str | os.PathLike[str],
    select: SelectLike = None,
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Export ``model`` to ONNX with the selected activations as extra named outputs.

    Parameters
    ----------
    model
        A ``torch.nn.Module`` (exported in its current train/eval mode), a JAX function,
        or an Equinox module.
    example_args
        The positional example inputs: a tuple, or a single tensor/array.
    output
        The ``.onnx`` file to write.
    select
        Points to add as outputs, each named by its point name; ``None``: the model's
        outputs only.
    example_kwargs
        Keyword example inputs.
    **options
        ``opset`` (default 18), ``check`` (run ``onnx.checker``, default True).

    Returns
    -------
    clouseau.exporters.onnx.OnnxExport
        The path, the ONNX input and output names, the exported points and the IR.
    """
    from clouseau.exporters.onnx import export_lowered

    args = example_args if isinstance(example_args, tuple) else (example_args,)
    kwargs = dict(example_kwargs or {})
    frontend = frontend_for(model, args)
    lowered = frontend.lower(model, args, kwargs, select)
    return export_lowered(
        lowered, frontend.name, output, model=model, args=args, kwargs=kwargs, **options
    )


def diff(a: Any, b: Any, **options: Any) -> Any:
    """Compare two captures point by point; see ``clouseau diff --help``."""
    from clouseau.store.diff import diff as _diff

    return _diff(a, b, **options)


def explore(source: Any, output: str | os.PathLike[str] | None = None, **options: Any) -> Any:
    """Write an interactive, self-contained HTML explorer of a graph, capture or diff.

    Parameters
    ----------
    source
        A Graph, an instrumented model, a capture directory or Capture, a diff result of
        two capture directories, or a pair ``(a, b)`` of captures to compare.
    output
        The ``.html`` file; ``None`` returns the HTML text.
    **options
        ``depth`` (module levels open at first), ``title``, and for a pair ``key_map``,
        ``rtol``, ``atol``. See docs/explorer.md.

    Returns
    -------
    Path or str
        The written file, or the page when ``output`` is None.
    """
    return _explore(source, output, **options)
