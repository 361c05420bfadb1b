"""The safetensors file format, read and written with numpy alone.

The format is 8 bytes of little-endian header length, a JSON header mapping each tensor
key to ``{"dtype", "shape", "data_offsets"}`` (plus ``__metadata__``: str -> str), then the
raw bytes. Owning both sides lets the writer stream arrays without a copy and lets the
reader validate every field, so a damaged file raises :class:`CaptureError`, never a crash.
Files interoperate with the ``safetensors`` package (tested both ways).
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from typing import BinaryIO

import ml_dtypes
import numpy as np

from clouseau.ir.errors import CaptureError
from clouseau.store.files import open_regular, read_at, rename_new, temp_file

TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "F32": np.dtype(np.float32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F64": np.dtype(np.float64),
    "C64": np.dtype(np.complex64),
}
_FROM_NUMPY = {v: k for k, v in TO_NUMPY.items()}
_MAX_HEADER = 100 * 2**20  # the safetensors package's own limit
_MAX_NDIM = 32  # numpy 1.x's limit; no activation comes near it
# What the JSON header of a tensor costs beyond its key, dtype code, shape and offsets.
_ENTRY_COST = len(',:{"dtype":"","shape":[],"data_offsets":[,]}')


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in a file."""

    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    stop: int


def dtype_code(dtype: np.dtype) -> str:
    """The safetensors code of ``dtype`` (either byte order); CaptureError if it has none."""
    dtype = np.dtype(dtype)
    try:
        return _FROM_NUMPY[dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype]
    except (KeyError, ValueError):
        raise CaptureError(
            f"cannot store dtype {dtype}: safetensors holds bool, (u)int8-64, float16, "
            "bfloat16, float8 (e4m3fn, e5m2), float32, float64 and complex64"
        ) from None


def storable(array: np.ndarray) -> np.ndarray:
    """``array`` as the file holds it: little-endian and C-contiguous (copied only if not)."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    # np.ascontiguousarray would turn a 0-d array into shape (1,); asarray keeps it 0-d.
    return np.asarray(array, order="C")


def entry_cost(key: str, dtype: np.dtype, shape: tuple[int, ...], max_offset: int) -> int:
    """An upper bound on the header bytes of one tensor, in a file whose data section is
    at most ``max_offset`` bytes long (the offsets are then at most that many digits)."""
    digits = 2 * len(str(max_offset))
    code = dtype_code(dtype)
    return (
        len(encode_basestring_ascii(key))
        + len(code)
        + len(",".join(map(str, shape)))
        + digits
        + _ENTRY_COST
    )


def header_overhead(metadata: dict[str, str]) -> int:
    """The bytes of a file that do not depend on its tensors: length, metadata, padding."""
    return 8 + len(json.dumps({"__metadata__": metadata}, separators=(",", ":"))) + 8


def write_file(
    path: Path,
    arrays: Sequence[tuple[str, np.ndarray]],
    metadata: dict[str, str],
    exclusive: bool = False,
) -> int:
    """Write ``arrays`` to ``path`` atomically; return the bytes written.

    The file is created exclusively under an unpredictable hidden name
    (``.<name>.<random>.tmp``, never through a link) and renamed when complete, so ``path``
    never holds a partial file: on any error, KeyboardInterrupt included, the temporary
    file is removed and the error propagates (an OSError becomes a CaptureError naming
    the file and the fix). With ``exclusive``, an existing ``path`` is never replaced.
    """
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    contiguous = []
    for key, array in arrays:
        array = storable(array)
        header[key] = {
            "dtype": dtype_code(array.dtype),
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
        contiguous.append(array)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section, as the safetensors package does
    tmp: Path | None = None
    try:
        fd, tmp = temp_file(path.parent, path.name)
        with os.fdopen(fd, "wb") as f:
            # uint8 views of the arrays' own memory: written without a copy.
            views = [memoryview(a.reshape(-1).view(np.uint8)) for a in contiguous if a.nbytes]
            _write_all(f, [struct.pack("<Q", len(raw)) + raw, *views])
        if exclusive:
            rename_new(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(err, FileExistsError):
            raise CaptureError(
                f"cannot write {path}: a file of that name is already there, which clouseau "
                "did not write (it is never overwritten); move it, or pick another path "
                "or filename_pattern"
            ) from None
        if isinstance(err, OSError) and not isinstance(err, CaptureError):
            raise CaptureError(_write_error(path, err)) from err
        raise
    return 8 + len(raw) + offset


def _write_all(f: BinaryIO, buffers: list[memoryview | bytes]) -> None:
    """Write ``buffers`` in order, in ``os.writev`` calls of at most ``WRITE_CHUNK`` bytes.

    One ``write`` per array costs more than the copy on a journaling file system (each
    call updates the inode), so small arrays go to the kernel together, several buffers
    per ``writev``. Large ones go in pieces: on some kernels one write of 2 MiB or more
    is 20-45x slower than the same bytes in 1 MiB writes (docs/performance.md, and
    ``python -m bench.write_chunk`` to measure a machine). A call may write less than
    asked (a signal): the loop goes on from where it stopped.
    """
    try:
        fd = f.fileno()
    except (AttributeError, OSError):  # a file object without a descriptor
        fd = -1
    pieces = _pieces(buffers, WRITE_CHUNK)
    if fd < 0 or not hasattr(os, "writev"):  # no writev on Windows
        for piece in pieces:
            f.write(piece)
        return
    first = 0  # pieces before it are written
    while first < len(pieces):
        stop, size = first, 0
        while stop < len(pieces) and stop - first < _IOV_MAX and size < WRITE_CHUNK:
            size += len(pieces[stop])
            stop += 1
        written = os.writev(fd, pieces[first:stop])
        if not written:  # a regular file never does this; a loop forever is worse
            raise OSError(errno.EIO, "the file system accepted no bytes")
        while first < len(pieces) and written >= len(pieces[first]):
            written -= len(pieces[first])
            first += 1
        if written:
            pieces[first] = pieces[first][written:]


def _pieces(buffers: Sequence[memoryview | bytes], chunk: int) -> list[memoryview]:
    """``buffers`` as views cut at every multiple of ``chunk`` bytes of the stream (no copy).

    Consecutive pieces up to such a cut fill one write of exactly ``chunk`` bytes, so a
    file takes ``ceil(size / chunk)`` calls and every call after the first starts on a
    page boundary of the file.
    """
    out: list[memoryview] = []
    offset = 0  # of the next byte in the stream
    for buffer in buffers:
        view = memoryview(buffer).cast("B")
        start = 0
        while start < len(view):
            stop = min(len(view), start + chunk - offset % chunk)
            out.append(view[start:stop])
            offset += stop - start
            start = stop
    return out


def _iov_max() -> int:
    try:
        limit = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):
        limit = -1
    return limit if limit > 0 else 16


# Buffers per os.writev call: the OS limit (1024 on Linux), 16 where it cannot be read.
_IOV_MAX = _iov_max()
# Bytes per write call. 1 MiB: below the 2 MiB from which single writes were measured
# 20-45x slower on this project's VMs, and no slower than larger writes where they are not
# (bench/write_chunk.py; figures in docs/performance.md).
WRITE_CHUNK = 2**20


def _write_error(path: Path, err: OSError) -> str:
    fix = {
        errno.ENOSPC: "the disk is full: free space, or pick another path",
        errno.EDQUOT: "the disk quota is exhausted: free space, or pick another path",
        errno.EFBIG: "the file is larger than the file system or `ulimit -f` allows: "
        "lower max_size_mb, or raise the limit",
        errno.EACCES: "permission denied: pick a writable path",
        errno.EROFS: "the file system is read-only: pick a writable path",
    }.get(err.errno or 0, "check the path and the disk")
    return f"cannot write {path}: {err.strerror or err}; {fix}"


def read_header(path: Path) -> tuple[dict[str, str], tuple[TensorEntry, ...]]:
    """Parse and validate the header of ``path``: (metadata, entries in file order).

    Every field is checked as the ``safetensors`` package checks it (known dtype, shape of
    non-negative ints, offsets that tile the data section exactly), so a truncated or
    edited file raises :class:`CaptureError` here rather than anything later.
    """
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise _bad(path, f"the file is {size} bytes long, too short for a header")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER:
                raise _bad(
                    path,
                    f"the header claims {length} bytes, over the {_MAX_HEADER // 2**20} MiB "
                    "a safetensors header may have (damaged, or not safetensors)",
                )
            if length > size - 8:
                raise _bad(
                    path,
                    f"the header claims {length} bytes but only {max(size - 8, 0)} follow "
                    "the 8-byte length (truncated, or not safetensors)",
                )
            raw = f.read(length)
    except OSError as err:
        if isinstance(err, CaptureError):
            raise
        raise CaptureError(f"cannot read {path}: {err.strerror or err}") from err
    if len(raw) != length:
        raise _bad(path, "the file changed while it was read")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        # ValueError also covers ints too long to parse, beside JSONDecodeError.
        raise _bad(path, f"the header is not valid JSON ({_short(err)})") from None
    if not isinstance(header, dict):
        raise _bad(path, "the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad(path, "__metadata__ must map strings to strings")
    data_start = 8 + length
    entries = sorted(
        (_entry(path, key, value, data_start) for key, value in header.items()),
        key=lambda e: (e.start, e.stop),
    )
    end = data_start
    for entry in entries:
        if entry.start != end:
            raise _bad(path, f"entry {entry.key!r} does not start where the one before ends")
        end = entry.stop
    if end != size:
        raise _bad(
            path,
            f"the tensors end at byte {end} but the file has {size} bytes "
            f"({'truncated' if end > size else 'trailing bytes'})",
        )
    return metadata, tuple(entries)


def _entry(path: Path, key: str, value: object, data_start: int) -> TensorEntry:
    if not isinstance(value, dict):
        raise _bad(path, f"entry {key!r} is not an object")
    code, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    dtype = TO_NUMPY.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise _bad(path, f"entry {key!r} has an unknown dtype {_short(code)}")
    if not (
        isinstance(shape, list)
        and len(shape) <= _MAX_NDIM
        and all(type(d) is int and 0 <= d < 2**63 for d in shape)
    ):
        raise _bad(path, f"entry {key!r} has an invalid shape {_short(shape)}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise _bad(path, f"entry {key!r} has invalid data_offsets {_short(offsets)}")
    nbytes = offsets[1] - offsets[0]
    # math.prod on Python ints: numpy's int64 product would wrap around on huge shapes.
    if nbytes != math.prod(shape) * dtype.itemsize:
        raise _bad(path, f"entry {key!r}: {nbytes} bytes do not hold shape {shape} of {dtype}")
    return TensorEntry(key, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1])


def read_array(path: Path, entry: TensorEntry) -> np.ndarray:
    """Read one tensor into a fresh, writable array (read straight into it, no copy)."""
    try:
        out = np.empty(entry.shape, entry.dtype)
    except (ValueError, MemoryError) as err:
        raise _bad(path, f"entry {entry.key!r} cannot be allocated ({_short(err)})") from None
    if not out.nbytes:
        return out
    view = memoryview(out.reshape(-1).view(np.uint8))
    try:
        got = _read_into(path, view, entry.start)
    except OSError as err:
        raise CaptureError(f"cannot read {entry.key!r} from {path}: {err.strerror or err}") from err
    if got != out.nbytes:
        raise _bad(path, f"entry {entry.key!r} is cut short (the file changed or is truncated)")
    return out


def _read_into(path: Path, view: memoryview, offset: int) -> int:
    fd = open_regular(path)
    try:
        return read_at(fd, view, offset)
    finally:
        os.close(fd)


def _short(value: object) -> str:
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(path: Path, why: str) -> CaptureError:
    return CaptureError(f"{path} is not a valid safetensors file: {why}")
