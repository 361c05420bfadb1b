"""What a crash can lose, and what a full disk loses (issue 15, items 4, 5 and 18)."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from clouseau.ir.errors import CaptureError
from clouseau.store import DirectorySink, load
from clouseau.store import writer as writer_module
from clouseau.store.writer import FLUSH_S
from tests.store.util import capture_files, put_calls, small_graph, value

# Small calls as fast as it can, with the defaults (max_size_mb=1024, flush_s=FLUSH_S):
# each value holds the wall time of its call. Prints "ready" after its first second. An
# argument after the path: seconds to pause between calls.
_FAST_WRITER = """
import sys, time
import numpy as np
from clouseau.ir.sink import SavedValue
from clouseau.store import DirectorySink

sink = DirectorySink(sys.argv[1])
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0  # seconds between calls
start = time.time()
said = False
while True:
    c = sink.begin_call()
    sink.put(c, 0, [SavedValue(("t",), "t", np.array([time.time()]))])
    sink.end_call(c)
    if pause:
        time.sleep(pause)
    if not said and time.time() - start > 1:
        print("ready", flush=True)
        said = True
"""


def _run_and_kill(path: Path, script: str, seconds: float, *args: str) -> float:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), str(path), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    time.sleep(seconds)
    killed_at = time.time()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    return killed_at


def test_kill_9_with_the_defaults_loses_at_most_the_last_seconds(tmp_path: Path) -> None:
    # Item 4: 32,890 small calls were all buffered (max_size_mb=1024) and a kill -9 left
    # 0 calls on disk, status.json saying "calls: 0".
    killed_at = _run_and_kill(tmp_path, _FAST_WRITER, 2.5 * FLUSH_S)
    cap = load(tmp_path)
    assert not cap.closed and not cap.complete
    assert len(cap.calls) > 100 and cap.calls == tuple(range(len(cap.calls)))
    last = float(cap.get("t", call=cap.calls[-1])[0])
    # The bound is flush_s (plus the time to write the file); the margin is for a busy
    # machine.
    assert killed_at - last < FLUSH_S + 3, f"lost the last {killed_at - last:.1f} s"
    assert cap.calls_made is not None and cap.calls_made >= len(cap.calls)
    # Files are cut between calls: every call on disk is whole.
    assert not cap.partial_calls


def test_a_call_cut_by_a_kill_is_marked_partial(tmp_path: Path) -> None:
    # Item 4: with rolling files, the last call on disk had 5 of its 6 points and loaded as
    # if complete.
    script = """
    import sys, time
    from pathlib import Path
    import numpy as np
    from clouseau.ir.sink import SavedValue
    from clouseau.store import DirectorySink

    sink = DirectorySink(sys.argv[1], max_size_mb=5 * 8 * 2**10 / 2**20 + 0.002)
    c = sink.begin_call()
    sink.put(c, 0, [SavedValue((f"p{j}",), f"p{j}", np.full(2**10, j, np.float64)) for j in range(6)])
    sink.end_call(c)
    c = sink.begin_call()
    sink.put(c, 0, [SavedValue((f"p{j}",), f"p{j}", np.full(2**10, j, np.float64)) for j in range(6)])
    while len(list(Path(sys.argv[1]).glob("*.safetensors"))) < 2:
        time.sleep(0.01)
    print("ready", flush=True)
    time.sleep(60)
    """
    _run_and_kill(tmp_path, script, 0)
    cap = load(tmp_path)
    assert [f.name for f in capture_files(tmp_path)] == [
        "activations-000.safetensors",
        "activations-001.safetensors",
    ]
    assert cap.calls == (0, 1)
    assert [r.name for r in cap.records if r.call == 0] == [f"p{j}" for j in range(6)]
    assert [r.name for r in cap.records if r.call == 1] == [f"p{j}" for j in range(4)]
    assert list(cap.partial_calls) == [1] and "incomplete" in cap.partial_calls[1]
    assert not cap.closed and not cap.complete


def test_status_stays_current_while_writing(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path, flush_s=0.2)
    put_calls(sink, [[value("a", np.ones(2))] for _ in range(7)])
    deadline = time.monotonic() + 10
    status: dict[str, object] = {}
    while time.monotonic() < deadline:
        status = json.loads((tmp_path / "status.json").read_text())
        if status["calls"] == 7 and status["files"]:
            break
        time.sleep(0.05)
    # Within a few flush_s, without a flush or close: calls made, and the file written.
    assert status["calls"] == 7 and status["closed"] is False
    assert status["files"] == ["activations-000.safetensors"]
    cap = load(tmp_path)
    assert cap.calls == tuple(range(7)) and cap.calls_made == 7 and not cap.closed
    sink.close()
    assert load(tmp_path).complete


def test_show_warns_about_a_capture_not_closed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from clouseau import cli

    # A call a millisecond: thousands of calls, not the fast writer's hundreds of thousands
    # that `show` would read for a minute to say the same.
    _run_and_kill(tmp_path, _FAST_WRITER, 2 * FLUSH_S, "0.001")
    cap = load(tmp_path)
    code = cli.main(["show", str(tmp_path), "--select", "nothing*"])
    out, err = capsys.readouterr()
    assert code == 2 and "matched no point" in err  # the warning comes first anyway
    whole = len(set(cap.calls) - set(cap.partial_calls))
    assert f"capture not closed: {cap.calls_made} calls made, {whole} on disk" in out


# -- item 5: a full disk ---------------------------------------------------------------------
def test_a_full_disk_records_every_lost_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Calls 10-11 returned normally, but were on no disk and in no list.
    real = writer_module.write_file

    def full_from_file_5(path: Path, *args: object) -> int:
        if path.name >= "activations-005.safetensors":
            raise OSError(28, "No space left on device")
        return real(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module, "write_file", full_from_file_5)
    sink = DirectorySink(tmp_path, max_size_mb=1e-6)  # one call per file
    # File 5 fails in the writer thread; the error surfaces at the next put or two.
    with pytest.raises(CaptureError, match=r"No space left .*call\(s\) 5, 6"):
        put_calls(sink, [[value("a", np.full(2, c))] for c in range(12)])
    with pytest.raises(CaptureError, match="No space left"):
        sink.close()
    cap = load(tmp_path)
    assert cap.calls == (0, 1, 2, 3, 4) and cap.calls_made is not None
    assert sorted(cap.partial_calls) == list(range(5, cap.calls_made))
    assert all("No space left" in why for why in cap.partial_calls.values())


def test_a_graph_whose_file_cannot_be_written_leaves_no_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Graph id 2 was handed out with no 0 or 1 on disk; draw then called the directory
    # "not a clouseau capture".
    from clouseau.store import files

    real = files.write_bytes
    fail = {"graph-001.json"}

    def flaky(path: Path, data: bytes, *, replace: bool) -> None:
        if path.name in fail:
            fail.discard(path.name)
            raise OSError(28, "No space left on device")
        real(path, data, replace=replace)

    monkeypatch.setattr(writer_module, "write_bytes", flaky)  # graph files go through it
    sink = DirectorySink(tmp_path)
    assert sink.add_graph(small_graph()) == 0
    with pytest.raises(CaptureError, match=r"cannot write .*graph-001\.json: No space left"):
        sink.add_graph(small_graph())
    assert sink.add_graph(small_graph()) == 1  # the id is handed out once its file exists
    sink.close()
    cap = load(tmp_path)
    assert len(cap.graphs) == 2 and not cap.damaged


def test_graphs_are_found_by_id(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path)
    for _ in range(3):
        sink.add_graph(small_graph())
    sink.close()
    (tmp_path / "graph-001.json").unlink()
    with pytest.warns(UserWarning, match=r"graph-001\.json: missing"):
        cap = load(tmp_path)
    assert len(cap.graphs) == 1


# -- item 18 ----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [1e308, math.inf, 2.0**70])
def test_any_huge_limit_means_never_roll(tmp_path: Path, size: float) -> None:
    sink = DirectorySink(tmp_path, max_size_mb=size)  # 1e308 raised a raw OverflowError
    put_calls(sink, [[value("a", np.ones(2))] for _ in range(3)])
    sink.close()
    assert len(capture_files(tmp_path)) == 1 and load(tmp_path).calls == (0, 1, 2)


def test_a_pattern_formatting_to_an_over_long_name_fails_at_instrument(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at most 255 bytes; this one has 313"):
        DirectorySink(tmp_path / "cap", filename_pattern="a" * 300 + "{idx:d}.safetensors")
    assert not (tmp_path / "cap").exists()
