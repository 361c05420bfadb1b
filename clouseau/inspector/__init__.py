"""The original clouseau API (``tail``, ``magnify``), now compiled instead of hooked.

Clouseau tracks the forward pass of a model and saves the intermediate arrays to a file.
It supports PyTorch and JAX/Equinox models. Where the original registered forward hooks
(PyTorch) or wrapped every callable pytree node in an ``io_callback`` wrapper (JAX),
:func:`tail` now calls :func:`clouseau.instrument` with a selection of module-output
points, so the same code records both frameworks, works inside ``jax.jit``, and needs no
``.block_until_ready()``: leaving the ``with`` block waits for every pending save.

Keys
----
``read_from_safetensors`` and ``magnify`` show a tail capture under the original keys:

- ``<dotted module path>.__call__`` for a module's output (``layers.0.__call__``); the
  root module's own output is ``__call__`` (its path is empty);
- ``<path>_<k>.__call__`` for the k-th extra call of one module within one forward pass
  (a shared block called twice), as the IR names it;
- ``<path>.__call__:<i>`` for the i-th array of a module that returns several;
- ``...#<c>`` appended for the c-th call of the model in the block (c = 1, 2, ...): every
  call is kept as its own array, never concatenated; call 0 has no suffix, so a block
  with one call reads exactly as before.

On disk a tail writes a plain clouseau capture directory (``clouseau.load``,
``clouseau show`` and ``clouseau diff`` read it), plus ``inspector.json`` mapping its
point names to these keys. See docs/migrating-from-hooks.md.
"""

from __future__ import annotations

import enum
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clouseau.inspector import _select, _view
from clouseau.store.layout import DEFAULT_PATTERN

__all__ = [
    "DEFAULT_PATH",
    "FrameworkEnum",
    "capture_directory",
    "is_jax_model",
    "is_torch_model",
    "magnify",
    "read_from_safetensors",
    "tail",
]

log = logging.getLogger(__name__)

DEFAULT_PATH = Path(".clouseau")
"""Where ``tail`` writes when no ``path`` is given (relative to the working directory)."""

AnyModel = Any
NodeTest = Callable[[tuple[str, ...], Any], bool]


class FrameworkEnum(enum.StrEnum):
    """The frameworks :func:`tail` records."""

    jax = "jax"
    torch = "torch"


def is_torch_model(model: AnyModel) -> bool:
    """Check if model is a torch model.

    Parameters
    ----------
    model : object
        Anything.

    Returns
    -------
    bool
        Whether ``model`` is a ``torch.nn.Module``.
    """
    # No module can exist before torch is imported: answering from sys.modules gives the
    # seed's answer without importing torch for a model of another framework.
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(model, torch.nn.Module)


def is_jax_model(model: AnyModel) -> bool:
    """Check if model is a jax model.

    Any Python object is a valid pytree (a bare object flattens to itself as a single
    leaf), so ``jax.tree.flatten`` alone would accept almost anything, e.g. an ``int``.
    We additionally require ``model`` to be a non-leaf pytree node that carries at least
    one ``jax.Array`` leaf, i.e. a container with parameters that clouseau can record.

    Parameters
    ----------
    model : object
        Anything.

    Returns
    -------
    bool
        Whether ``model`` is a pytree container holding at least one ``jax.Array``.
    """
    # A jax.Array cannot exist before jax is imported (as for torch above).
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    leaves, treedef = jax.tree.flatten(model)
    # a bare leaf (int, str, plain object, or a raw array) flattens to itself
    if treedef.num_leaves == 1 and leaves[0] is model:
        return False
    return any(isinstance(leaf, jax.Array) for leaf in leaves)


def capture_directory(path: str | Path) -> Path:
    """The capture directory :func:`tail` writes for ``path``.

    Parameters
    ----------
    path : str or Path
        A directory, or a file name ending in ``.safetensors`` as the seed's examples
        wrote (``.clouseau/trace-torch.safetensors``).

    Returns
    -------
    Path
        ``path`` itself, or for ``x.safetensors`` the directory ``x`` beside it, so that
        two tails given two file names in one folder never replace each other's files.
        ``magnify`` and ``read_from_safetensors`` accept the ``x.safetensors`` name too.
    """
    path = Path(path)
    return path.with_suffix("") if path.suffix == ".safetensors" else path


class _Recorder:
    """What :func:`tail` returns: entering instruments the model, leaving writes the capture."""

    def __init__(
        self,
        model: AnyModel,
        path: str | Path = DEFAULT_PATH,
        filter_: NodeTest | None = None,
        is_leaf: NodeTest | None = None,
        max_size_mb: float = 1024,
        filename_pattern: str = DEFAULT_PATTERN,
    ) -> None:
        self.model = model
        self.path = capture_directory(path)
        self.filter_ = filter_
        self.is_leaf = is_leaf
        self.max_size_mb = max_size_mb
        self.filename_pattern = filename_pattern
        self.modules: tuple[str, ...] = ()
        self._selector: _select.ModuleOutputs | None = None
        self._fmodel: Any = None

    @property
    def framework(self) -> FrameworkEnum:
        """The model's framework; ValueError when it is neither PyTorch nor JAX."""
        if is_torch_model(self.model):
            return FrameworkEnum.torch
        if is_jax_model(self.model):
            return FrameworkEnum.jax
        raise ValueError(
            f"The model ({type(self.model).__name__}) does not seem to be a PyTorch or JAX "
            "model: PyTorch models inherit from torch.nn.Module, JAX models are callable "
            "pytrees (e.g. an equinox.Module) holding at least one jax.Array. For a plain "
            "JAX function use clouseau.instrument(fn, select=...)."
        )

    def __enter__(self) -> AnyModel:
        if self._fmodel is not None:
            raise RuntimeError("this recorder is already recording; call inspector.tail(...) again")
        import clouseau
        from clouseau.capture import frontend_named

        if self.framework is FrameworkEnum.torch:
            filter_, is_leaf = _is_torch_module, _is_none
        else:
            filter_, is_leaf = _is_callable, _is_jax_array
        # The frontend's own spelling of a child's name: our paths equal the IR's module paths.
        children = frontend_named(self.framework.value).children
        self.modules = _select.chosen_modules(
            self.model, children, self.filter_ or filter_, self.is_leaf or is_leaf
        )
        # Nothing chosen: run the model unchanged (a selection that matches nothing is an
        # error for instrument, but the seed only warned, at exit).
        self._selector = _select.ModuleOutputs(frozenset(self.modules)) if self.modules else None
        self._fmodel = clouseau.instrument(
            self.model,
            select=self._selector,
            path=self.path,
            max_size_mb=self.max_size_mb,
            filename_pattern=self.filename_pattern,
        )
        _select.remove_sidecar(self.path)
        return self._fmodel

    def __exit__(self, *exc_info: object) -> None:
        fmodel, self._fmodel = self._fmodel, None
        if fmodel is None:
            return
        keys = self._selector.keys if self._selector is not None else {}
        try:
            fmodel.close()
        finally:
            _select.write_sidecar(self.path, keys)
        if not keys:
            log.warning("No arrays were recorded. Please check the filter function.")


def _is_torch_module(path: tuple[str, ...], node: Any) -> bool:
    import torch

    return isinstance(node, torch.nn.Module)


def _is_none(path: tuple[str, ...], node: Any) -> bool:
    return node is None


def _is_callable(path: tuple[str, ...], node: Any) -> bool:
    return callable(node)


def _is_jax_array(path: tuple[str, ...], node: Any) -> bool:
    import jax

    return isinstance(node, jax.Array)


def tail(
    model: AnyModel,
    path: str | Path = DEFAULT_PATH,
    filter_: NodeTest | None = None,
    is_leaf: NodeTest | None = None,
    filename_pattern: str = DEFAULT_PATTERN,
    max_size_mb: int = 1024,
) -> _Recorder:
    """Tail and record the forward pass of a model.

    Parameters
    ----------
    model : object
        The model to inspect: a PyTorch ``nn.Module`` or a JAX/Equinox model (a callable
        pytree holding ``jax.Array`` leaves).
    path : str or Path
        The capture directory. A name ending in ``.safetensors`` (``run/trace.safetensors``)
        is written to the directory of that stem (``run/trace/``); see
        :func:`capture_directory`.
    filter_ : callable, optional
        ``filter_(path, node) -> bool`` chooses the modules whose output is recorded.
        ``path`` is a tuple of strings in both frameworks (``("layers", "0")``; ``()``
        for the root), ``node`` the submodule. Default: every ``nn.Module`` (PyTorch),
        every callable node of the pytree (JAX), the root included.
    is_leaf : callable, optional
        ``is_leaf(path, node) -> bool``: True stops the descent below ``node`` (``node``
        itself is still offered to ``filter_``). Default: ``None`` nodes (PyTorch),
        ``jax.Array`` leaves (JAX).
    filename_pattern : str
        File names in the capture directory, with an ``{idx}`` field for rolled files.
    max_size_mb : int
        Files roll over at this size; an array is never split.

    Returns
    -------
    _Recorder
        A context manager: ``with tail(model) as fmodel`` gives the model to call (same
        calling convention and outputs); leaving the block writes everything to ``path``.
        Keys are ``<module path>.__call__`` (``__call__`` for the root), with ``#<c>`` for
        the c-th later call of the model; see the module docstring.

    Examples
    --------
    >>> import torch
    >>> from clouseau import inspector
    >>> model = torch.nn.Linear(10, 5)
    >>> with inspector.tail(model, path=".clouseau/trace-torch.safetensors") as fmodel:
    ...     out = fmodel(torch.randn(3, 10))

    With a JAX/Equinox model no ``.block_until_ready()`` is needed, and ``jax.jit`` works
    inside the block:

    >>> import jax
    >>> with inspector.tail(model, path=".clouseau/trace-jax.safetensors") as fmodel:
    ...     fmodel(x, time)
    """
    return _Recorder(
        model=model,
        path=path,
        filter_=filter_,
        is_leaf=is_leaf,
        max_size_mb=max_size_mb,
        filename_pattern=filename_pattern,
    )


def read_from_safetensors(
    filename: str | Path, framework: str = "numpy", device: Any = None
) -> dict[str, Any]:
    """Read the arrays of a capture file, in recorded order.

    Parameters
    ----------
    filename : str or Path
        A ``.safetensors`` file written by :func:`tail` or :func:`clouseau.instrument`,
        a file of the original clouseau, any other safetensors file, or a capture
        directory (all its files). The ``x.safetensors`` name given to ``tail`` works.
    framework : {"numpy", "torch", "jax"}
        The array type returned (``"np"``, ``"pt"`` and ``"flax"`` are accepted too).
        bfloat16 arrays stay bfloat16 (``ml_dtypes.bfloat16`` in numpy).
    device : optional
        Where to put the arrays: a torch device (``"cuda:0"``), a JAX device or platform
        name (``"cpu"``, ``"gpu"``); None for the framework's default.

    Returns
    -------
    dict
        Key -> array. A tail capture uses the original keys (``layers.0.__call__``,
        ``__call__#1``, ...); another clouseau capture its point names; any other file
        its own keys (ordered by the original clouseau's ``order`` metadata if present).
    """
    kind = _view.Framework.parse(framework)
    arrays = _view.read_arrays(_view.resolve(filename))
    return _view.convert(arrays, kind, device)


def magnify(
    filename: str | Path = DEFAULT_PATH / "activations-000.safetensors",
    framework: str = "numpy",
    device: Any = None,
) -> None:
    """Show the recorded arrays as a tree.

    In a notebook (an IPython kernel is running) the nested arrays are shown with
    treescope; in a terminal as a rich tree with each array's dtype, shape and statistics
    (mean, std, min, max over the finite values; the count of non-finite ones).

    Parameters
    ----------
    filename : str or Path
        What :func:`read_from_safetensors` reads: a file or a capture directory.
    framework : {"numpy", "torch", "jax"}
        The array type handed to treescope.
    device : optional
        Where the arrays are put (see :func:`read_from_safetensors`).
    """
    data = read_from_safetensors(filename, framework=framework, device=device)
    _view.show(_view.unflatten(data), title=str(filename))
