"""Bad input gives a clear error that names the cause and the fix (docs/errors.md)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from clouseau.ir.errors import CaptureError
from clouseau.store import DamagedCaptureWarning, DirectorySink, MemorySink, load, open_sink
from clouseau.store import safetensors_io as sio
from tests.store.util import capture_files, put_calls, small_graph, value


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cap"
    sink = DirectorySink(path)
    sink.add_graph(small_graph())
    put_calls(sink, [[value("a", np.arange(10.0)), value("b", np.ones((2, 2), np.int32))]])
    sink.close()
    return path


# -- load() -------------------------------------------------------------------------------
def test_load_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(
        CaptureError, match=r"does not exist; pass the directory given to clouseau\.instrument"
    ):
        load(tmp_path / "nope")


def test_load_a_file_that_is_not_safetensors(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello, this is not a capture at all")
    with pytest.raises(
        CaptureError, match=r"notes\.txt is not a valid safetensors file: the header claims"
    ):
        load(tmp_path / "notes.txt")


def test_load_a_directory_that_is_not_a_capture(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CaptureError, match=r"is not a clouseau capture: .*\(0 other \.safetensors"):
        load(tmp_path)


def test_load_a_truncated_file(capture_dir: Path) -> None:
    (file,) = capture_files(capture_dir)
    data = file.read_bytes()
    file.write_bytes(data[:-5])
    with pytest.raises(
        CaptureError, match=r"activations-000.safetensors is not a valid .*truncated"
    ):
        load(capture_dir, strict=True)
    file.write_bytes(data[:20])
    with pytest.raises(CaptureError, match=r"the header claims .* bytes but only 12 follow"):
        load(capture_dir, strict=True)
    file.write_bytes(data[:3])
    with pytest.raises(CaptureError, match="3 bytes long, too short for a header"):
        load(capture_dir, strict=True)


def test_load_a_file_with_trailing_bytes(capture_dir: Path) -> None:
    (file,) = capture_files(capture_dir)
    file.write_bytes(file.read_bytes() + b"junk")
    with pytest.raises(CaptureError, match="trailing bytes"):
        load(capture_dir, strict=True)


def _edit_header(file: Path, edit: object) -> None:
    data = file.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    raw = edit(header) if callable(edit) else edit
    raw = raw if isinstance(raw, bytes) else json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (b"{not json" + b" " * 40, "the header is not valid JSON"),
        (b"[1, 2, 3]", "the header is not a JSON object"),
        (b"\xff\xfe" * 8, "the header is not valid JSON"),
        (b"[" * 100_000, "the header is not valid JSON"),
        (b'{"a": 1' + b"0" * 5000 + b"}", "the header is not valid JSON"),
        (lambda h: h["a#0"].update(dtype="F128"), "unknown dtype 'F128'"),
        (lambda h: h["a#0"].update(dtype=["F32"]), "unknown dtype"),
        (lambda h: h["a#0"].update(shape=[-1]), "invalid shape"),
        (lambda h: h["a#0"].update(shape=[2**32, 2**32]), "do not hold shape"),
        (lambda h: h["a#0"].update(shape=[0, 2**62]), "do not hold shape"),
        (lambda h: h["a#0"].update(shape=[1] * 40), "invalid shape"),
        (lambda h: h["a#0"].update(shape="10"), "invalid shape"),
        (lambda h: h["a#0"].update(data_offsets=[8, 0]), "invalid data_offsets"),
        (lambda h: h["a#0"].update(data_offsets=[0, 10**30]), "do not hold shape"),
        (
            lambda h: h["b#0"].update(data_offsets=[0, 16]),
            "does not start where the one before ends",
        ),
        (lambda h: h.update({"a#0": 5}), "entry 'a#0' is not an object"),
        (
            lambda h: h.update(__metadata__={"format": 1}),
            "__metadata__ must map strings to strings",
        ),
        (lambda h: h["__metadata__"].update(clouseau="[[1]]"), "the clouseau metadata is damaged"),
        (lambda h: h["__metadata__"].update(clouseau="{}"), "the clouseau metadata is damaged"),
        (
            lambda h: h["__metadata__"].update(clouseau="[" * 50_000),
            "the clouseau metadata is damaged",
        ),
        (
            lambda h: h["__metadata__"].update(clouseau='[["a#0",["a"],"a",1e999,0,0,[]]]'),
            "the clouseau metadata is damaged",
        ),
        (
            lambda h: h["__metadata__"].update(clouseau='[["zz#0",["a"],"a",0,0,0,[]]]'),
            "the metadata lists 'zz#0' but the file does not hold it",
        ),
        (lambda h: h["__metadata__"].pop("clouseau"), "the clouseau metadata is damaged"),
    ],
)
def test_load_a_damaged_header(capture_dir: Path, edit: object, message: str) -> None:
    (file,) = capture_files(capture_dir)
    _edit_header(file, edit)
    with pytest.raises(CaptureError, match=message):
        cap = load(capture_dir, strict=True)
        for r in cap.records:
            cap.get(r.name, call=r.call)
    # Without strict, the damaged file is skipped and reported (issue 15, item 17).
    with pytest.warns(DamagedCaptureWarning, match=message):
        cap = load(capture_dir)
    assert re.search(message, cap.damaged[file.name]) and not cap.complete


def test_load_damaged_graph_and_status(capture_dir: Path) -> None:
    (capture_dir / "graph-000.json").write_text('{"format": "clouseau.graph", "nodes": 3}')
    with pytest.raises(CaptureError, match=r"graph-000\.json is damaged"):
        load(capture_dir, strict=True)
    (capture_dir / "graph-000.json").write_text("[]")
    with pytest.raises(CaptureError, match=r"graph-000\.json is damaged"):
        load(capture_dir, strict=True)
    (capture_dir / "graph-000.json").unlink()
    (capture_dir / "status.json").write_text('{"failed_calls": {"x": 1}}')
    with pytest.raises(CaptureError, match=r"status\.json is damaged"):
        load(capture_dir, strict=True)


def test_a_file_changed_after_load_is_reported_when_read(capture_dir: Path) -> None:
    cap = load(capture_dir)
    (file,) = capture_files(capture_dir)
    file.write_bytes(file.read_bytes()[:-40])
    with pytest.raises(CaptureError, match="cut short"):
        cap["a"]


def test_a_fifo_in_the_directory_does_not_hang_load(capture_dir: Path) -> None:
    os.mkfifo(capture_dir / "pipe.safetensors")
    assert load(capture_dir).names() == ("a", "b")


# -- sink arguments -----------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, -0.5, math.nan])
def test_max_size_mb_must_be_positive(tmp_path: Path, bad: float) -> None:
    with pytest.raises(
        ValueError, match=r"max_size_mb must be a positive number of megabytes \(e\.g\. 1024"
    ):
        DirectorySink(tmp_path, max_size_mb=bad)
    assert list(tmp_path.iterdir()) == []  # nothing was created or removed


@pytest.mark.parametrize("bad", ["100", True, None, [1]])
def test_max_size_mb_must_be_a_number(tmp_path: Path, bad: object) -> None:
    with pytest.raises(TypeError, match="max_size_mb must be a positive number"):
        DirectorySink(tmp_path, max_size_mb=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_size_mb must be a positive number"):
        open_sink(None, bad, "a-{idx}.safetensors")  # type: ignore[arg-type]


def test_max_size_mb_accepts_numpy_numbers(tmp_path: Path) -> None:
    assert DirectorySink(tmp_path, max_size_mb=np.int64(2)).max_bytes == 2 * 2**20


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("activations.safetensors", r"has no \{idx\} field"),
        ("act-{idx:.0s}.safetensors", "is invalid"),
        ("act-{}.safetensors", "is invalid"),
        ("act-{i}.safetensors", "is invalid"),
        ("act-{idx}.bin", "must end with .safetensors"),
        ("sub/act-{idx}.safetensors", "no '/'"),
        (".act-{idx}.safetensors", "no leading '.'"),
    ],
)
def test_filename_pattern_is_checked(tmp_path: Path, pattern: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DirectorySink(tmp_path, filename_pattern=pattern)
    with pytest.raises(ValueError, match=message):
        open_sink(None, 1024, pattern)


def test_filename_pattern_must_be_a_string(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="filename_pattern must be a str"):
        DirectorySink(tmp_path, filename_pattern=3)  # type: ignore[arg-type]


def test_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(CaptureError, match=r"the capture path .*/f is a file; pass a directory"):
        DirectorySink(tmp_path / "f")


def test_path_that_cannot_be_written(tmp_path: Path) -> None:
    # Works as root too: no permission bit stops root, but a file cannot hold a directory.
    (tmp_path / "f").write_text("x")
    with pytest.raises(
        CaptureError, match=r"cannot write to the capture path .*/f/cap: Not a directory"
    ):
        DirectorySink(tmp_path / "f" / "cap")


def test_path_under_proc_cannot_be_written() -> None:
    with pytest.raises(CaptureError, match="cannot write to the capture path /proc/clouseau-test"):
        DirectorySink("/proc/clouseau-test")


@pytest.mark.skipif(os.geteuid() == 0, reason="root bypasses permission bits")
def test_read_only_directory(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(CaptureError, match="Permission denied; pass a writable directory"):
            DirectorySink(tmp_path / "cap")
    finally:
        tmp_path.chmod(0o700)


def test_write_errors_name_the_file_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sio.os, "replace", full)
    with pytest.raises(
        CaptureError,
        match=r"cannot write .*/x.safetensors: No space left on device; the disk is full: free space, or pick another path",
    ):
        sio.write_file(tmp_path / "x.safetensors", [("a", np.ones(3))], {})
    assert list(tmp_path.iterdir()) == []  # the temporary file went too


def test_memory_sink_after_close() -> None:
    sink = MemorySink()
    sink.close()
    with pytest.raises(CaptureError, match="this capture is closed"):
        sink.begin_call()
