"""One writer per directory, forks and dropped models (issue 15, items 3, 13 and 14)."""

from __future__ import annotations

import gc
import os
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
from tests.store.util import put_calls, run_python, same, value

# Writes calls (value 1000 * writer + call) until killed; prints "ready" once it holds
# the directory.
_WRITER = """
import sys, time
import numpy as np
from clouseau.ir.sink import SavedValue
from clouseau.store import DirectorySink

sink = DirectorySink(sys.argv[1])
print("ready", flush=True)
for call in range(int(sys.argv[2])):
    c = sink.begin_call()
    sink.put(c, 0, [SavedValue(("a",), "a", np.full(4, 1000.0 + c))])
    sink.end_call(c)
    time.sleep(0.001)
sink.close()
"""


def test_a_second_process_is_refused_naming_the_first(tmp_path: Path) -> None:
    # Item 3: two processes on one path mixed their calls silently.
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), str(tmp_path), "100000"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with pytest.raises(CaptureError) as info:
            DirectorySink(tmp_path)
        message = str(info.value)
        assert f"is being written by process {child.pid} on host " in message
        assert "since 20" in message and "another path" in message
    finally:
        child.kill()
        child.wait(timeout=30)
    # The kernel dropped the dead writer's lock: the directory is free again.
    sink = DirectorySink(tmp_path)
    put_calls(sink, [[value("b", np.ones(2))]])
    sink.close()
    assert load(tmp_path).names() == ("b",)


def test_two_models_of_one_process_on_one_path_are_refused(tmp_path: Path) -> None:
    # Item 3: the second model on the default path replaced the first one's calls.
    first = DirectorySink(tmp_path)
    put_calls(first, [[value("a", np.full(2, c))] for c in range(300)])
    with pytest.raises(CaptureError, match=r"another instrumented model of this process"):
        DirectorySink(tmp_path)
    first.close()
    cap = load(tmp_path)
    assert cap.calls == tuple(range(300)) and cap.complete
    DirectorySink(tmp_path).close()  # once closed, the path is free


def test_a_dropped_model_frees_the_path_and_its_thread(tmp_path: Path) -> None:
    # Item 14: a model dropped without close() kept its thread and buffers until exit.
    threads = threading.active_count()
    for round_ in range(15):
        sink = DirectorySink(tmp_path)
        put_calls(sink, [[value("a", np.full(2**16, float(round_)))]])
        del sink  # no close()
    gc.collect()
    deadline = time.monotonic() + 10
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads
    cap = load(tmp_path)  # the last one was completed when dropped
    assert same(cap["a"], np.full(2**16, 14.0)) and cap.complete


def test_a_dropped_model_releases_its_memory() -> None:
    result = run_python(
        """
        import gc, tempfile
        import numpy as np
        from clouseau.ir.sink import SavedValue
        from clouseau.store import DirectorySink

        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096

        with tempfile.TemporaryDirectory() as d:
            before = None
            for i in range(15):
                sink = DirectorySink(d)
                c = sink.begin_call()
                sink.put(c, 0, [SavedValue(("a",), "a", np.ones(2**22))])  # 32 MiB buffered
                del sink
                gc.collect()
                if i == 2:
                    before = rss()
            print((rss() - before) // 2**20)
        """
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) < 64, f"RSS grew by {result.stdout.strip()} MiB"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("busy", [True, False], ids=["busy writer", "idle writer"])
def test_a_forked_child_never_touches_the_parents_capture(tmp_path: Path, busy: bool) -> None:
    # Item 13: a child forked while the writer thread was busy hung at exit; with an idle
    # writer, the child's exit marked the parent's capture closed.
    result = run_python(
        f"""
        import os, json, threading
        import numpy as np
        from clouseau.ir.errors import CaptureError
        from clouseau.ir.sink import SavedValue
        from clouseau.store import DirectorySink, writer

        sink = DirectorySink({str(tmp_path)!r}, max_size_mb=1)
        release = threading.Event()
        if {busy}:
            real = writer.write_file
            def slow(*args):
                release.wait(5)
                return real(*args)
            writer.write_file = slow
        for c in range(4):
            call = sink.begin_call()
            sink.put(call, 0, [SavedValue(("a",), "a", np.full(2**16, float(c)))])
            sink.end_call(call)
        pid = os.fork()
        if pid == 0:
            try:
                sink.begin_call()
            except CaptureError as err:
                print("child:", err, flush=True)
            raise SystemExit(0)  # a normal exit: atexit handlers and finalizers run
        release.set()
        _, status = os.waitpid(pid, 0)
        print("child exit", status, flush=True)
        print("closed after child:", json.load(open({str(tmp_path / "status.json")!r}))["closed"])
        sink.close()
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "child: this instrumented model writes its capture from the process" in out
    assert "child exit 0" in out and "closed after child: False" in out
    cap = load(tmp_path)
    assert cap.calls == (0, 1, 2, 3) and cap.complete
