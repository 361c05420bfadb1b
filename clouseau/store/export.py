"""Rows of a capture as Arrow/Parquet files and as a Hugging Face ``datasets.Dataset``.

One column per name; a row of shape ``[d]`` becomes a fixed-size list of ``d`` values
(nested for more axes). Arrow has no bfloat16 or float8, so those are widened to float32.
Files are written a block of rows at a time, so memory stays flat in the capture's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clouseau.ir.errors import MissingExtraError
from clouseau.store.rows import Column, columns

if TYPE_CHECKING:
    from clouseau.store.capture import Capture


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise MissingExtraError("pyarrow", "arrow") from None
    return pyarrow


def _row_names(cap: Capture, names: Sequence[str] | None) -> tuple[str, ...]:
    if names is not None:
        return tuple([names] if isinstance(names, str) else names)
    return tuple(cap.names())


def _arrow_column(pa: Any, array: np.ndarray) -> Any:
    if array.dtype.kind == "f" and array.dtype.itemsize < 4 and array.dtype != np.float16:
        array = array.astype(np.float32)  # bfloat16 / float8: no Arrow type
    values: Any = pa.array(np.ascontiguousarray(array).reshape(-1))
    for size in reversed(array.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values


def _tables(cols: tuple[Column, ...], rows_per_file: int) -> Any:
    pa = _pyarrow()
    n = len(cols[0])
    for lo in range(0, n, rows_per_file):
        hi = min(n, lo + rows_per_file)
        arrays = [_arrow_column(pa, c.slice(lo, hi)) for c in cols]
        yield pa.table(arrays, names=[c.name for c in cols])


def write_shards(
    cap: Capture, directory: Any, names: Sequence[str] | None, rows_per_file: int, fmt: str
) -> list[Path]:
    """Write the rows of ``names`` as ``part-NNNNN.parquet`` / ``.arrow`` files."""
    pa = _pyarrow()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cols = columns(cap, _row_names(cap, names))
    files = []
    for i, table in enumerate(_tables(cols, rows_per_file)):
        file = out / f"part-{i:05d}.{fmt}"
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, file)
        else:  # the Arrow stream format, which datasets memory-maps
            with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
        files.append(file)
    return files


def hf_dataset(
    cap: Capture, names: Sequence[str] | None, directory: Any, rows_per_file: int
) -> Any:
    """A ``datasets.Dataset`` over Arrow files of the rows (memory-mapped, not loaded)."""
    try:
        import datasets
    except ImportError:
        raise MissingExtraError("datasets", "arrow") from None
    if directory is None:
        if cap.path is None:
            raise ValueError("an in-memory capture needs directory= for the Arrow files")
        directory = Path(cap.path) / "hf"
    files = write_shards(cap, directory, names, rows_per_file, "arrow")
    parts = [datasets.Dataset.from_file(str(f)) for f in files]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
