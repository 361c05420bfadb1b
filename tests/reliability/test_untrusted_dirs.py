"""Reading directories someone else may have written to (issue 15, items 10, 11, 15, 17).

Links out of the directory, FIFOs and devices, huge or sparse files, terminal escapes in
names, damaged, missing and duplicated files; and show/diff linear in the calls.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import clouseau
from clouseau import cli
from clouseau.ir.errors import CaptureError
from clouseau.store import Capture, DamagedCaptureWarning, DirectorySink, load
from clouseau.store.layout import FORMAT
from tests.store.util import capture_files, put_calls, same, small_graph, value


def _capture(path: Path, calls: int = 4, max_size_mb: float = 1024) -> Path:
    sink = DirectorySink(path, max_size_mb=max_size_mb)
    sink.add_graph(small_graph())
    put_calls(
        sink, [[value("relu", np.full((2, 3), c, np.float32), (), "act")] for c in range(calls)]
    )
    sink.close()
    return path


# -- item 10: links, FIFOs, devices, sizes ------------------------------------------------------
def test_a_link_to_a_file_outside_is_not_loaded(tmp_path: Path) -> None:
    cap = _capture(tmp_path / "cap", calls=1)
    outside = _capture(tmp_path / "outside", calls=3)
    (cap / "activations-009.safetensors").symlink_to(capture_files(outside)[0])
    with pytest.warns(DamagedCaptureWarning, match="symbolic link"):
        loaded = load(cap)
    assert loaded.calls == (0,) and "symbolic link" in loaded.damaged["activations-009.safetensors"]
    with pytest.raises(CaptureError, match="symbolic link"):
        load(cap, strict=True)


@pytest.mark.parametrize("kind", ["dev-zero link", "fifo", "huge sparse"])
def test_draw_refuses_a_graph_file_it_cannot_read_safely(tmp_path: Path, kind: str) -> None:
    # clouseau draw on a graph-000.json linked to /dev/zero grew to 22 GB; on a FIFO it hung.
    cap = _capture(tmp_path / "cap")
    graph = cap / "graph-000.json"
    graph.unlink()
    if kind == "dev-zero link":
        graph.symlink_to("/dev/zero")
        message = "symbolic link"
    elif kind == "fifo":
        os.mkfifo(graph)
        message = "not a regular file"
    else:
        with open(graph, "wb") as f:
            f.truncate(300 * 2**20)  # sparse: nothing on disk
        message = "larger than 256 MiB"
    with pytest.raises(CaptureError, match=message):
        clouseau.draw(cap, tmp_path / "g.dot")
    assert cli.main(["draw", str(cap), "-o", str(tmp_path / "g.dot")]) == 2
    with pytest.warns(DamagedCaptureWarning, match=message):
        assert load(cap).calls == (0, 1, 2, 3)


def test_show_of_a_sparse_file_with_a_huge_array_stays_in_bounded_memory(tmp_path: Path) -> None:
    # A sparse 8 KB-on-disk file holding a 256 MiB array made show peak at 7.1 GB.
    path = tmp_path / "cap"
    path.mkdir()
    records = json.dumps([["big#0", ["big"], "big", 0, 0, 0, []]])
    metadata = {"format": FORMAT, "clouseau": records, "open": "[]", "done": "[]"}
    header = {
        "__metadata__": metadata,
        "big#0": {"dtype": "F32", "shape": [2**26], "data_offsets": [0, 2**28]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    file = path / "activations-000.safetensors"
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 2**28)
    script = f"""
        from clouseau import cli
        code = cli.main(["show", {str(path)!r}, "--stats"])
        # VmHWM, not ru_maxrss: the latter keeps the high-water mark of the forking
        # parent (this pytest process) across exec.
        status = open("/proc/self/status").read().split("VmHWM:")[1]
        print("peak", int(status.split()[0]) // 1024, code)
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    peak, code = out.stdout.split("peak")[-1].split()
    assert code == "0" and "mean 0" in out.stdout
    # The array itself (256 MiB) plus the interpreter; a float64 copy would add 512 MiB.
    assert int(peak) < 256 + 300, f"peak RSS {peak} MiB"


# -- item 11: terminal escapes -------------------------------------------------------------
def test_show_and_diff_print_no_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = "\x1b[2J\x1b]0;pwned\x07relu"
    sink = DirectorySink(tmp_path / "a")
    put_calls(sink, [[value(evil, np.ones(3))], [value("x\u202eyz", np.ones(2))]])
    call = sink.begin_call()
    sink.fail_call(call, RuntimeError("\x1b[31mred\x1b[0m"))
    sink.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert cli.main(["show", str(tmp_path / "a")]) == 0
    assert cli.main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--all"]) == 0
    assert cli.main(["show", str(tmp_path / "a"), "--select", "\x1b[2Jnothing"]) == 2
    out, err = capsys.readouterr()
    for text in (out, err):
        assert not any((ord(c) < 32 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in text)
        assert "\u202e" not in text
    assert "\\x1b[2J\\x1b]0;pwned\\x07relu" in out and "x\\u202eyz" in out
    assert "\\x1b[31mred" in out and "\\x1b[2Jnothing" in err


# -- item 15: show and diff linear in calls --------------------------------------------------
def test_show_and_diff_read_each_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4,000 calls took 40 s each: every call scanned every record, and every get() every
    # call of its name. Here the records are listed once per capture (counted), whatever
    # the number of calls, and get(name, call=k) is one dict lookup.
    calls = 400
    _capture(tmp_path / "a", calls=calls, max_size_mb=0.05)
    _capture(tmp_path / "b", calls=calls, max_size_mb=0.05)
    listed = []
    records = Capture.records.fget

    def counting_records(self: Capture) -> object:
        listed.append(1)
        return records(self)  # type: ignore[misc]

    monkeypatch.setattr(Capture, "records", property(counting_records))
    assert cli.main(["show", str(tmp_path / "a")]) == 0
    assert len(listed) <= 2
    listed.clear()
    assert cli.main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert len(listed) <= 2
    assert f"{calls} close" in capsys.readouterr().out


# -- item 17: damaged, missing and duplicated files -------------------------------------------
def test_one_truncated_file_loses_only_that_file(tmp_path: Path) -> None:
    cap = _capture(tmp_path / "cap", calls=4, max_size_mb=1e-6)  # one file per call
    files = capture_files(cap)
    files[1].write_bytes(files[1].read_bytes()[:-7])
    with pytest.warns(DamagedCaptureWarning, match="activations-001.safetensors"):
        loaded = load(cap)
    assert loaded.calls == (0, 2, 3) and not loaded.complete
    assert "truncated" in loaded.damaged["activations-001.safetensors"]
    for call in (0, 2, 3):
        assert same(loaded.get("relu", call=call), np.full((2, 3), call, np.float32))
    with pytest.raises(CaptureError, match=r"activations-001\.safetensors: .*truncated"):
        load(cap, strict=True)


def test_show_lists_a_damaged_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cap = _capture(tmp_path / "cap", calls=3, max_size_mb=1e-6)
    capture_files(cap)[2].write_bytes(b"garbage")
    assert cli.main(["show", str(cap)]) == 0
    out = capsys.readouterr().out
    assert "damaged file activations-002.safetensors (skipped)" in out and "call 1" in out


def test_a_missing_file_in_the_middle_is_reported(tmp_path: Path) -> None:
    # It loaded silently: calls=(0, 1, 2, 3) with 12 of 16 arrays.
    cap = _capture(tmp_path / "cap", calls=4, max_size_mb=1e-6)
    capture_files(cap)[2].unlink()
    with pytest.warns(DamagedCaptureWarning, match="missing"):
        loaded = load(cap)
    assert loaded.calls == (0, 1, 3)
    assert loaded.damaged == {
        "activations-002.safetensors": "missing: status.json lists it as written"
    }
    with pytest.raises(CaptureError, match=r"activations-002\.safetensors: missing"):
        load(cap, strict=True)


def test_a_duplicated_file_is_reported(tmp_path: Path) -> None:
    cap = _capture(tmp_path / "cap", calls=2, max_size_mb=1e-6)
    shutil.copy(capture_files(cap)[1], cap / "activations-001 copy.safetensors")
    with pytest.warns(DamagedCaptureWarning, match="duplicate"):
        loaded = load(cap)
    assert loaded.calls == (0, 1) and list(loaded.damaged) == ["activations-001.safetensors"]
    assert (
        "activations-001 copy.safetensors holds already"
        in loaded.damaged["activations-001.safetensors"]
    )
