"""Reading captures back for the seed API: legacy keys, framework arrays, and magnify's views.

:func:`read_arrays` reads a clouseau capture (a file or a directory), a file of the
original clouseau (key order in its metadata) or any other safetensors file, with numpy
alone; :func:`convert` hands the arrays to torch or JAX. :func:`show` draws the nested
arrays with treescope in a notebook and as a rich tree (shape, dtype, statistics) in a
terminal.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from clouseau.inspector._select import legacy_depth, read_sidecar
from clouseau.store.array_stats import array_stats

SEP = "."
VALUE = "__value__"  # where an array goes when its key is also a prefix of other keys


class Framework(enum.Enum):
    """Array types :func:`clouseau.inspector.read_from_safetensors` returns."""

    NUMPY = "numpy"
    TORCH = "torch"
    JAX = "jax"

    @staticmethod
    def parse(name: str) -> Framework:
        # safetensors' own spellings ("np", "pt", "flax") keep working too.
        aliases = {"np": "numpy", "pt": "torch", "pytorch": "torch", "flax": "jax"}
        try:
            return Framework(aliases.get(str(name).lower(), str(name).lower()))
        except ValueError:
            raise ValueError(f"framework must be 'numpy', 'torch' or 'jax'; got {name!r}") from None


def resolve(path: str | Path) -> Path:
    """The file or capture directory that ``path`` names.

    ``x.safetensors`` that does not exist but whose stem ``x/`` is a directory is that
    directory: :func:`clouseau.inspector.tail` writes ``path="x.safetensors"`` there.
    """
    path = Path(path)
    if path.exists():
        return path
    if path.suffix == ".safetensors" and path.with_suffix("").is_dir():
        return path.with_suffix("")
    raise FileNotFoundError(
        f"{path} does not exist; pass a .safetensors file or the capture directory given to "
        "inspector.tail(path=...) (a tail path 'x.safetensors' is written to the directory 'x/')"
    )


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of a file or directory, by key, in recorded order (numpy arrays)."""
    from clouseau.store.layout import is_capture_file

    if path.is_dir():
        return _read_capture(path, path)
    if is_capture_file(path, strict=True):
        return _read_capture(path, path.parent)
    return _read_plain(path)


def _read_capture(path: Path, directory: Path) -> dict[str, np.ndarray]:
    from clouseau.store.reader import load

    capture = load(path)
    legacy = read_sidecar(directory)
    out: dict[str, np.ndarray] = {}
    for record in capture.records:
        array = capture.get(record.name, call=record.call, index=record.index)
        for name in _keys_of(record.names, legacy):
            out[_call_key(name, record.call, record.index)] = array
    return out


def _keys_of(names: tuple[str, ...], legacy: Mapping[str, tuple[str, ...]] | None) -> list[str]:
    # A plain capture keeps the store's own name; a tail capture lists one key per module
    # whose output the value is, innermost first (the order the seed's hooks fired in).
    keys = [k for n in names for k in legacy.get(n, ())] if legacy is not None else []
    if not keys:
        return [names[0]]
    return sorted(dict.fromkeys(keys), key=legacy_depth, reverse=True)


def _call_key(name: str, call: int, index: tuple[int, ...]) -> str:
    # Call 0 keeps the bare key, so a block with one call reads exactly as the seed's did;
    # later calls are never concatenated onto it but get their own "#<call>" key.
    return name + (f"#{call}" if call else "") + "".join(f"@{i}" for i in index)


def _read_plain(path: Path) -> dict[str, np.ndarray]:
    from clouseau.store.safetensors_io import read_array, read_header

    metadata, entries = read_header(path)
    by_key = {e.key: e for e in entries}
    order = [k for k in _legacy_order(metadata) if k in by_key]
    order += [e.key for e in entries if e.key not in set(order)]
    return {key: read_array(path, by_key[key]) for key in order}


def _legacy_order(metadata: Mapping[str, str]) -> list[str]:
    # The original clouseau kept insertion order in the metadata: first as {"0": key, ...},
    # later as {"order": json.dumps({"0": key, ...})}.
    table: Mapping[str, Any] = metadata
    if "order" in metadata:
        try:
            table = json.loads(metadata["order"])
        except ValueError:
            return []
    if not isinstance(table, Mapping):
        return []
    numbered = [(int(k), str(v)) for k, v in table.items() if str(k).isdigit()]
    return [v for _, v in sorted(numbered)]


def convert(arrays: Mapping[str, np.ndarray], framework: Framework, device: Any) -> dict[str, Any]:
    """The arrays as ``framework`` arrays on ``device`` (None: the framework's default)."""
    if framework is Framework.NUMPY:
        if device not in (None, "cpu"):
            raise ValueError(
                f"numpy arrays live on the host; device must be None or 'cpu', got {device!r}"
            )
        return dict(arrays)
    if framework is Framework.TORCH:
        return {k: _to_torch(v, device) for k, v in arrays.items()}
    return {k: _to_jax(v, device) for k, v in arrays.items()}


def _to_torch(array: np.ndarray, device: Any) -> Any:
    import ml_dtypes
    import torch

    # torch cannot take ml_dtypes arrays: reinterpret the bits through a same-width int.
    bits = {
        np.dtype(ml_dtypes.bfloat16): (np.int16, torch.bfloat16),
        np.dtype(ml_dtypes.float8_e4m3fn): (np.int8, torch.float8_e4m3fn),
        np.dtype(ml_dtypes.float8_e5m2): (np.int8, torch.float8_e5m2),
    }.get(array.dtype)
    if bits is not None:
        tensor = torch.from_numpy(np.ascontiguousarray(array).view(bits[0])).view(bits[1])
    else:
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor if device is None else tensor.to(device)


def _to_jax(array: np.ndarray, device: Any) -> Any:
    import jax

    if isinstance(device, str):
        device = jax.devices(device)[0]
    return jax.device_put(array, device)


def unflatten(data: Mapping[str, Any], sep: str = SEP) -> dict[str, Any]:
    """``{"a.b.__call__": x}`` -> ``{"a": {"b": {"__call__": x}}}`` (the seed's nesting).

    A key that is also a prefix of other keys keeps its array under ``"__value__"``.
    """
    root: dict[str, Any] = {}
    for key, value in data.items():
        parts = key.split(sep)
        node = root
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {} if child is None else {VALUE: child}
                node[part] = child
            node = child
        if isinstance(node.get(parts[-1]), dict):
            node[parts[-1]][VALUE] = value
        else:
            node[parts[-1]] = value
    return root


def in_notebook() -> bool:
    """Whether an IPython kernel (Jupyter, Colab, VS Code) runs us, so HTML can be shown."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(tree: Mapping[str, Any], title: str) -> None:
    """Draw nested arrays: treescope in a notebook, a rich tree in a terminal."""
    if in_notebook():
        import treescope

        with treescope.active_autovisualizer.set_scoped(treescope.ArrayAutovisualizer()):
            treescope.display(tree)
        return
    from rich.console import Console

    Console().print(rich_tree(tree, title))


def rich_tree(tree: Mapping[str, Any], title: str) -> Any:
    """A ``rich.tree.Tree`` of nested arrays: one line per array with shape, dtype, stats."""
    from rich.tree import Tree

    def add(branch: Tree, node: Mapping[str, Any]) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                add(branch.add(f"[bold]{key}[/bold]"), value)
            else:
                branch.add(f"[cyan]{key}[/cyan]  {describe(value)}")

    top = Tree(f"[bold magenta]{title}[/bold magenta]")
    add(top, tree)
    return top


def describe(value: Any) -> str:
    """``f32[3,5]  mean=... std=... min=... max=...`` for a numpy, torch or JAX array."""
    array = as_numpy(value)
    head = f"{array.dtype}[{','.join(map(str, array.shape))}]"
    if array.size == 0:
        return f"{head}  (empty)"
    s = array_stats(array)
    bad = s.nan + s.inf
    text = (
        f"mean={s.mean:.4g} std={s.std:.4g} min={s.min:.4g} max={s.max:.4g}"
        if bad < s.size
        else "no finite values"
    )
    return f"{head}  {text}" + (f"  non-finite={bad}" if bad else "")


def as_numpy(value: Any) -> np.ndarray:
    """A host numpy copy of a numpy, torch or JAX array (bfloat16 stays bfloat16)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        import ml_dtypes
        import torch

        tensor = value.detach().cpu()
        if tensor.dtype is torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy()
    return np.asarray(value)
