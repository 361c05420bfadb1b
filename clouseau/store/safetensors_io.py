"""The safetensors file format, read and written with numpy alone.

The format is 8 bytes of little-endian header length, a JSON header mapping each tensor
key to ``{"dtype", "shape", "data_offsets"}`` (plus ``__metadata__``: str -> str), then the
raw bytes. Owning both sides lets the writer stream arrays without a copy and lets the
reader validate every field, so a damaged file raises :class:`CaptureError`, never a crash.
Files interoperate with the ``safetensors`` package (tested).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from clouseau.ir.errors import CaptureError

_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "F32": np.dtype(np.float32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F64": np.dtype(np.float64),
    "C64": np.dtype(np.complex64),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}
_MAX_HEADER = 100 * 2**20  # the safetensors package's own limit


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in a file."""

    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    stop: int


def dtype_code(dtype: np.dtype) -> str:
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise CaptureError(
            f"cannot store dtype {dtype}: safetensors holds bool, (u)int8-64, float16, "
            "bfloat16, float32, float64 and complex64"
        ) from None


def write_file(path: Path, arrays: Sequence[tuple[str, np.ndarray]], metadata: dict[str, str]) -> int:
    """Write ``arrays`` to ``path`` atomically (temporary name, then rename); return bytes written."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    contiguous = []
    for key, array in arrays:
        array = np.ascontiguousarray(array)
        header[key] = {
            "dtype": dtype_code(array.dtype),
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
        contiguous.append(array)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section, as the safetensors package does
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for array in contiguous:
                if array.nbytes:
                    f.write(memoryview(array.reshape(-1).view(np.uint8)))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return 8 + len(raw) + offset


def read_header(path: Path) -> tuple[dict[str, str], tuple[TensorEntry, ...]]:
    """Parse and validate the header of ``path``: (metadata, entries in file order)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _bad(path, f"the file is {size} bytes long, too short for a header")
            (length,) = struct.unpack("<Q", head)
            if length > min(_MAX_HEADER, size - 8):
                raise _bad(path, f"the header claims {length} bytes but the file has {size - 8} after it (truncated or not safetensors)")
            raw = f.read(length)
    except OSError as err:
        raise CaptureError(f"cannot read {path}: {err.strerror or err}") from err
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise _bad(path, f"the header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise _bad(path, "the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad(path, "__metadata__ must map strings to strings")
    data_start = 8 + length
    entries = tuple(_entry(path, key, value, data_start, size) for key, value in header.items())
    return metadata, tuple(sorted(entries, key=lambda e: e.start))


def _entry(path: Path, key: str, value: object, data_start: int, size: int) -> TensorEntry:
    if not isinstance(value, dict):
        raise _bad(path, f"entry {key!r} is not an object")
    dtype = _TO_NUMPY.get(value.get("dtype"))  # type: ignore[arg-type]
    shape, offsets = value.get("shape"), value.get("data_offsets")
    if dtype is None:
        raise _bad(path, f"entry {key!r} has unknown dtype {value.get('dtype')!r}")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise _bad(path, f"entry {key!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise _bad(path, f"entry {key!r} has invalid data_offsets {offsets!r}")
    start, stop = data_start + offsets[0], data_start + offsets[1]
    if not data_start <= start <= stop <= size:
        raise _bad(path, f"entry {key!r} lies outside the file (truncated?)")
    if stop - start != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise _bad(path, f"entry {key!r}: {stop - start} bytes do not hold shape {shape} of {dtype}")
    return TensorEntry(key, dtype, tuple(shape), start, stop)


def read_array(path: Path, entry: TensorEntry) -> np.ndarray:
    """Read one tensor; the result is a fresh, writable array."""
    try:
        with open(path, "rb") as f:
            f.seek(entry.start)
            raw = f.read(entry.stop - entry.start)
    except OSError as err:
        raise CaptureError(f"cannot read {entry.key!r} from {path}: {err.strerror or err}") from err
    if len(raw) != entry.stop - entry.start:
        raise _bad(path, f"entry {entry.key!r} is cut short (the file changed or is truncated)")
    return np.frombuffer(bytearray(raw), dtype=entry.dtype).reshape(entry.shape)


def _bad(path: Path, why: str) -> CaptureError:
    return CaptureError(f"{path} is not a valid safetensors file: {why}")
