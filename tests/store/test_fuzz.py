"""Fuzzing the reader: whatever the bytes, load() raises CaptureError or loads; it never
crashes with another exception and never hangs."""

from __future__ import annotations

import json
import signal
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clouseau.ir.errors import CaptureError
from clouseau.store import DirectorySink, load
from tests.store.util import capture_files, put_calls, value

FUZZ = settings(
    max_examples=150,
    deadline=1000,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _sample() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        sink = DirectorySink(tmp)
        put_calls(
            sink,
            [
                [
                    value("a", np.arange(6, dtype=np.float32).reshape(2, 3), (), "alias"),
                    value("b", np.array(1.5, dtype=ml_dtypes.bfloat16)),
                    value("c", np.zeros((0, 2), np.int8)),
                ],
                [value("loop", np.ones(2, np.int64), (i,)) for i in range(2)],
            ],
        )
        sink.close()
        return capture_files(Path(tmp))[0].read_bytes()


SAMPLE = _sample()
(HEADER_LENGTH,) = struct.unpack("<Q", SAMPLE[:8])
HEADER = json.loads(SAMPLE[8 : 8 + HEADER_LENGTH])
DATA = SAMPLE[8 + HEADER_LENGTH :]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


class Hang(Exception):
    pass


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang("load() took more than 5 s")


def _load_everything(workdir: Path, data: bytes) -> None:
    """Write ``data`` as a capture file and read all of it; only CaptureError may escape."""
    file = workdir / "activations-000.safetensors"
    file.write_bytes(data)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        for path in (file, workdir):
            cap = load(path)
            cap.names()
            for r in cap.records:
                cap.get(r.name, call=r.call, index=r.index)
    except CaptureError:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _with_header(header: dict[str, Any], data: bytes = DATA) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def test_the_sample_loads(workdir: Path) -> None:
    (workdir / "activations-000.safetensors").write_bytes(SAMPLE)
    cap = load(workdir)
    assert cap.names() == ("a", "alias", "b", "c", "loop") and cap.calls == (0, 1)


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes(workdir: Path, data: bytes) -> None:
    _load_everything(workdir, data)


@FUZZ
@given(st.integers(min_value=0, max_value=2**64 - 1), st.binary(max_size=400))
def test_random_bytes_after_a_length(workdir: Path, length: int, data: bytes) -> None:
    _load_everything(workdir, struct.pack("<Q", length) + data)


@FUZZ
@given(st.integers(min_value=0, max_value=len(SAMPLE) - 1))
def test_truncations(workdir: Path, size: int) -> None:
    _load_everything(workdir, SAMPLE[:size])


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=8 + HEADER_LENGTH - 1), st.integers(0, 255)),
        min_size=1,
        max_size=6,
    )
)
def test_byte_edits_in_the_header(workdir: Path, edits: list[tuple[int, int]]) -> None:
    data = bytearray(SAMPLE)
    for position, byte in edits:
        data[position] = byte
    _load_everything(workdir, bytes(data))


def _edit_path(header: dict[str, Any], path: tuple[Any, ...], new: Any) -> None:
    target: Any = header
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new


TENSOR_FIELDS = st.sampled_from(["dtype", "shape", "data_offsets", "extra"])
TENSOR_KEYS = st.sampled_from([k for k in HEADER if k != "__metadata__"])


@FUZZ
@given(TENSOR_KEYS, TENSOR_FIELDS, JSON_VALUES)
def test_edits_of_tensor_entries(workdir: Path, key: str, field: str, new: Any) -> None:
    header = json.loads(json.dumps(HEADER))
    _edit_path(header, (key, field), new)
    _load_everything(workdir, _with_header(header))


@FUZZ
@given(
    st.integers(min_value=0, max_value=4),
    st.integers(min_value=0, max_value=7),
    JSON_VALUES,
    st.sampled_from(["record", "format", "records", "metadata"]),
)
def test_edits_of_the_clouseau_metadata(
    workdir: Path, row: int, column: int, new: Any, what: str
) -> None:
    header = json.loads(json.dumps(HEADER))
    records = json.loads(header["__metadata__"]["clouseau"])
    edits: dict[str, Callable[[], None]] = {
        "record": lambda: records[row].__setitem__(min(column, len(records[row]) - 1), new),
        "format": lambda: header["__metadata__"].__setitem__("format", new),
        "records": lambda: records.__setitem__(row, new),
        "metadata": lambda: header.__setitem__("__metadata__", new),
    }
    edits[what]()
    if what in ("record", "records"):
        header["__metadata__"]["clouseau"] = json.dumps(records)
    _load_everything(workdir, _with_header(header))


@FUZZ
@given(st.data())
def test_moved_offsets_and_shapes(workdir: Path, data: st.DataObject) -> None:
    header = json.loads(json.dumps(HEADER))
    key = data.draw(TENSOR_KEYS)
    header[key]["shape"] = data.draw(st.lists(st.integers(0, 2**40), max_size=5))
    header[key]["data_offsets"] = data.draw(st.lists(st.integers(0, 2**40), min_size=2, max_size=2))
    _load_everything(workdir, _with_header(header))
