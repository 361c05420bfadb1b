"""Faults while writing: interrupts, kills, a full disk, threads, long runs (issue 7)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from clouseau.ir.errors import CaptureError
from clouseau.store import DirectorySink, load
from clouseau.store import safetensors_io as sio
from clouseau.store import writer as writer_module
from tests.store.util import (
    capture_files,
    put_calls,
    read_all,
    rss_bytes,
    run_python,
    same,
    temp_files,
    value,
)

# A child that writes calls of three 2 MiB arrays (value 10*call+j) into 64 MiB files until
# told to stop; it prints "ready" once its first file is complete. After its calls it
# waits for the signal with the capture open: a child that could finish first (a parent
# slow to send the signal on a busy machine) would exit before it, stderr empty. It sets
# Python's SIGINT handler itself, so that it does not depend on what it inherits: a process
# whose parent ignores SIGINT (a command run with `&` from a script) inherits SIG_IGN, and
# Python then installs no KeyboardInterrupt handler (pytest sets its own, so this guards
# the child run from any other parent).
WRITER_CHILD = """
import signal, sys, time
import numpy as np
signal.signal(signal.SIGINT, signal.default_int_handler)
from clouseau.ir.sink import SavedValue
from clouseau.store import DirectorySink

sink = DirectorySink(sys.argv[1], max_size_mb=64)
said = False
for call in range(int(sys.argv[2])):
    c = sink.begin_call()
    sink.put(c, 0, [SavedValue((f"p{j}",), f"p{j}", np.full(2**18, 10.0 * c + j)) for j in range(3)])
    if not said and len(list(__import__("pathlib").Path(sys.argv[1]).glob("*.safetensors"))) >= 1:
        print("ready", flush=True)
        said = True
time.sleep(120)
sink.close()
"""


def _check_every_file(path: Path) -> set[int]:
    """Every complete file holds whole, correct arrays; returns the calls found."""
    calls = set()
    for file in capture_files(path):
        for key, array in read_all(file).items():
            name, call = key.split("#")
            calls.add(int(call))
            assert array.shape == (2**18,) and np.all(array == 10.0 * int(call) + int(name[1:]))
    return calls


def _start_child(path: Path, calls: int = 60) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER_CHILD), str(path), str(calls)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
    return child


def test_keyboard_interrupt_inside_write_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = tmp_path / "activations-000.safetensors"
    sio.write_file(earlier, [("a#0", np.arange(10.0))], {})
    before = earlier.read_bytes()

    class Interrupting:
        """A file whose third write is interrupted, as Ctrl-C would mid-array."""

        def __init__(self, path: Path, mode: str) -> None:
            self.file, self.writes = open(path, mode), 0  # noqa: SIM115 - closed in __exit__

        def write(self, data: object) -> int:
            self.writes += 1
            if self.writes == 3:
                raise KeyboardInterrupt
            return self.file.write(data)  # type: ignore[arg-type]

        def __enter__(self) -> Interrupting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

    monkeypatch.setattr(sio.os, "fdopen", Interrupting)
    target = tmp_path / "activations-001.safetensors"
    with pytest.raises(KeyboardInterrupt):
        sio.write_file(target, [("b#1", np.ones(1000)), ("c#1", np.ones(1000))], {})
    assert not target.exists()  # nothing partial under the final name
    assert temp_files(tmp_path) == []  # the temporary file was removed
    assert earlier.read_bytes() == before


def test_sigint_while_writing_leaves_only_complete_files(tmp_path: Path) -> None:
    child = _start_child(tmp_path)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert "KeyboardInterrupt" in err
    assert temp_files(tmp_path) == []  # the writer finished its file before exiting
    calls = _check_every_file(tmp_path)
    cap = load(tmp_path)  # closed at exit: everything put before the interrupt is there
    assert json.loads((tmp_path / "status.json").read_text())["closed"] is True
    assert set(cap.calls) == calls and cap.calls == tuple(range(len(calls)))
    for call in cap.calls:
        assert [r.name for r in cap.records if r.call == call] == ["p0", "p1", "p2"]


def test_sigkill_while_writing_leaves_no_partial_file(tmp_path: Path) -> None:
    child = _start_child(tmp_path, calls=80)
    deadline = time.monotonic() + 20
    while not temp_files(tmp_path) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    child.kill()  # SIGKILL, most likely in the middle of writing the temporary file
    child.wait(timeout=30)
    _check_every_file(tmp_path)  # every file under a final name is complete
    cap = load(tmp_path)
    for record in cap.records:
        cap.get(record.name, call=record.call)
    # The next capture in the directory sweeps the leftover temporary file away once it
    # starts (a capture that never starts leaves the earlier one as it was).
    sink = DirectorySink(tmp_path)
    sink.begin_call()
    sink.close()
    assert temp_files(tmp_path) == [] and capture_files(tmp_path) == []
    assert load(tmp_path).calls_made == 1


def test_disk_full_gives_a_clear_error_and_keeps_earlier_files(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import resource, signal
        import numpy as np
        from clouseau.ir.errors import CaptureError
        from clouseau.ir.sink import SavedValue
        from clouseau.store import DirectorySink

        # Without this, exceeding RLIMIT_FSIZE kills the process instead of raising EFBIG.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))
        sink = DirectorySink({str(tmp_path)!r}, max_size_mb=4)
        c = sink.begin_call()
        sink.put(c, 0, [SavedValue(("small",), "small", np.ones(1000))])
        sink.flush()
        c = sink.begin_call()
        sink.put(c, 0, [SavedValue((f"big{{i}}",), "big", np.ones(2**14)) for i in range(30)])
        for step in (sink.flush, lambda: sink.put(c, 0, []), sink.close):
            try:
                step()
                print("no error")
            except CaptureError as err:
                print(err)
        """
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and "no error" not in lines
    message = lines[0]
    assert message.startswith(
        f"writing the capture to {tmp_path} failed: cannot write {tmp_path}/activations-001.safetensors: File too large"
    )
    assert "lower max_size_mb, or raise the limit" in message
    assert "the files written before are complete and load with clouseau.load" in message
    assert temp_files(tmp_path) == []
    assert [f.name for f in capture_files(tmp_path)] == ["activations-000.safetensors"]
    cap = load(tmp_path)
    assert same(cap["small"], np.ones(1000)) and cap.calls == (0,)


def test_a_writer_failure_surfaces_at_the_next_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = writer_module.write_file

    def fail_second(path: Path, *args: object) -> int:
        if path.name.endswith("001.safetensors"):
            raise OSError(28, "No space left on device")
        return real(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module, "write_file", fail_second)
    sink = DirectorySink(tmp_path, max_size_mb=0.01)
    put_calls(sink, [[value("a", np.ones(1000))]])  # 8 kB: file 0
    put_calls(sink, [[value("a", np.ones(1000))]])  # rolls: file 0 written, file 1 fills
    with pytest.raises(
        CaptureError,
        match=r"No space left on device\. The capture stopped: nothing more is written",
    ):
        sink.flush()  # file 1 fails in the writer thread; flush waits for it and says so
    # The capture stopped; every later call says why (issue 15, item 18).
    with pytest.raises(CaptureError, match=r"No space left.*The capture stopped"):
        sink.begin_call()
    with pytest.raises(CaptureError, match="No space left"):
        sink.put(1, 0, [value("a", np.ones(3))])
    with pytest.raises(CaptureError):
        sink.close()
    sink.close()  # a second close is quiet
    cap = load(tmp_path)
    assert cap.calls == (0,) and cap.closed and not cap.complete
    assert list(cap.partial_calls) == [1] and "No space left" in cap.partial_calls[1]


def test_put_does_not_block_until_a_full_file_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = writer_module.write_file

    def slow(*args: object) -> int:
        release.wait(10)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module, "write_file", slow)
    sink = DirectorySink(tmp_path, max_size_mb=1)
    arrays = [np.full(2**15, i, np.float64) for i in range(7)]  # 256 KiB each, 3 per file
    call = sink.begin_call()
    start = time.perf_counter()
    for i in range(6):  # file 0 goes to the (stalled) writer; file 1 fills
        sink.put(call, 0, [value(f"a{i}", arrays[i])])
    fast = time.perf_counter() - start
    threading.Timer(0.5, release.set).start()
    start = time.perf_counter()
    sink.put(call, 0, [value("a6", arrays[6])])  # file 1 is full and must wait for file 0
    waited = time.perf_counter() - start
    sink.close()
    assert fast < 0.25 and waited > 0.3, (fast, waited)
    assert len(capture_files(tmp_path)) == 3
    assert [r.name for r in load(tmp_path).records] == [f"a{i}" for i in range(7)]


def test_two_threads_put_concurrently(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path, max_size_mb=0.05)
    barrier = threading.Barrier(2)
    made: dict[int, int] = {}
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            barrier.wait()
            for n in range(60):
                call = sink.begin_call()
                made[call] = 1000 * thread + n
                tag = float(made[call])
                sink.put(
                    call,
                    0,
                    [
                        value(f"t{thread}.a", np.full(300, tag)),
                        value(f"t{thread}.b", np.full((2, 2), tag, np.float32)),
                    ],
                )
                time.sleep(0)
                sink.put(call, 0, [value(f"t{thread}.c", np.full(7, tag, np.int64))])
                sink.end_call(call)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sink.close()
    assert not errors
    cap = load(tmp_path)
    assert cap.calls == tuple(range(120)) and len(capture_files(tmp_path)) > 2
    for call, tag in made.items():
        records = [r for r in cap.records if r.call == call]
        thread = tag // 1000
        assert [r.name for r in records] == [f"t{thread}.a", f"t{thread}.b", f"t{thread}.c"]
        for r in records:
            assert np.all(cap.get(r.name, call=call) == tag)


def test_a_thousand_calls_with_rolling_files_in_flat_memory(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path, max_size_mb=0.25)
    rng = np.random.default_rng(1)
    payload = rng.standard_normal(1024).astype(np.float32)  # 4 kB

    def one_call() -> None:
        call = sink.begin_call()
        values = [value(f"layer{j}.relu", payload * (call + j)) for j in range(3)]
        sink.put(call, 0, values)
        sink.end_call(call)

    for _ in range(100):  # warm up: buffers, the writer thread, allocator pools
        one_call()
    sink.flush()
    before = rss_bytes()
    for _ in range(1000):
        one_call()
    sink.close()
    grown = rss_bytes() - before
    # 1000 calls put 12 MB through the sink; kept buffered, RSS would grow by about that.
    assert grown < 6 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"

    cap = load(tmp_path)
    assert len(capture_files(tmp_path)) > 40
    assert cap.calls == tuple(range(1100))
    records = cap.records
    assert [(r.call, r.order, r.name) for r in records] == [
        (c, j, f"layer{j}.relu") for c in range(1100) for j in range(3)
    ]
    for call in (0, 537, 1099):
        assert same(cap.get("layer2.relu", call=call), payload * (call + 2))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_atexit_closes_an_unclosed_sink(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import numpy as np
        from clouseau.ir.sink import SavedValue
        from clouseau.store import DirectorySink
        sink = DirectorySink({str(tmp_path)!r})
        c = sink.begin_call()
        sink.put(c, 0, [SavedValue(("a",), "a", np.arange(5))])
        """
    )
    assert result.returncode == 0, result.stderr
    assert same(load(tmp_path)["a"], np.arange(5))
