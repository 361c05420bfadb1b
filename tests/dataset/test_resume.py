"""Resume after kill -9, an exception, Ctrl-C or a full disk equals an uninterrupted run;
a changed model, selection or data is refused; on_error="skip" keeps going."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import clouseau  # noqa: E402
from clouseau.dataset import sink as sink_module  # noqa: E402
from tests.dataset.models import seeded_mlp, vectors  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SELECT = ["fc1", "act"]
SIZE = 0.0015  # MB: a file every two or three batches


def _record(path, data, **kwargs):
    options = {"select": SELECT, "path": path, "progress": False, "max_size_mb": SIZE}
    return clouseau.record(seeded_mlp(), data, **{**options, "stats": True, **kwargs})


def assert_same(a, b):
    keys = [r.key for r in a.records]
    assert len(keys) == len(set(keys)), "a batch was stored twice"
    assert keys == [r.key for r in b.records]
    assert a.calls == b.calls and a.names() == b.names()
    for name in a.names():
        for x, y in zip(a.all_calls(name), b.all_calls(name), strict=True):
            np.testing.assert_array_equal(x, y)
    assert a.batches == b.batches
    for name in SELECT:
        sa, sb = a.stats(name), b.stats(name)
        assert sa.count == sb.count
        np.testing.assert_array_equal(sa.mean, sb.mean)
        np.testing.assert_array_equal(sa.var, sb.var)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    data = vectors(40)
    cap = _record(tmp_path_factory.mktemp("ref") / "cap", data)
    model, seen = seeded_mlp(), []
    model.fc1.register_forward_hook(lambda m, a, o: seen.append(o.detach().numpy()))
    with torch.no_grad():
        for x in data:
            model(x)
    for k, expected in enumerate(seen):
        np.testing.assert_array_equal(cap.get("fc1", call=k), expected)
    return cap


CHILD = textwrap.dedent(
    """
    import sys, time
    import clouseau
    from tests.dataset.models import seeded_mlp, vectors

    class Slow:
        def __len__(self):
            return 40
        def __iter__(self):
            for x in vectors(40):
                time.sleep(0.15)
                yield x

    clouseau.record(seeded_mlp(), Slow(), select=["fc1", "act"], path=sys.argv[1], stats=True,
                    progress=False, max_size_mb=0.0015)
    """
)


TRACE_RUNS = 0  # the first call is the trace's own run: the model runs once per batch


def _runs(path, data) -> int:
    model, calls = seeded_mlp(), []
    model.fc1.register_forward_pre_hook(lambda m, a: calls.append(1))
    clouseau.record(model, data, select=SELECT, path=path, progress=False)
    return len(calls)


class Counted:
    """The same batches as the child's, counting those the model actually runs."""

    def __init__(self) -> None:
        self.data = vectors(40)

    def __len__(self) -> int:
        return 40

    def __iter__(self):
        return iter(self.data)


@pytest.mark.slow
def test_kill_9_then_resume_equals_uninterrupted(tmp_path, reference):
    path = tmp_path / "cap"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            record = path / "record.json"
            if record.is_file() and len(json.loads(record.read_text())["files"]) >= 3:
                break
            time.sleep(0.05)
        assert child.poll() is None, "the child ended before it could be killed"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    done = len(json.loads((path / "record.json").read_text())["batches"])
    assert 0 < done < 40
    assert _runs(tmp_path / "one", vectors(1)) == 1 + TRACE_RUNS
    model, calls = seeded_mlp(), []
    model.fc1.register_forward_pre_hook(lambda m, a: calls.append(1))
    cap = clouseau.record(
        model, Counted(), select=SELECT, path=path, resume=True, stats=True, progress=False,
        max_size_mb=SIZE,
    )  # fmt: skip
    assert len(calls) == 40 - done + TRACE_RUNS  # the recorded batches were not run again
    assert_same(cap, reference)


class _failing:
    """The reference's 40 batches, raising ``error`` instead of batch ``at``."""

    def __init__(self, at: int, error: BaseException) -> None:
        self.at, self.error = at, error

    def __len__(self) -> int:
        return 40

    def __iter__(self):
        for k, x in enumerate(vectors(40)):
            if k == self.at:
                raise self.error
            yield x


@pytest.mark.parametrize("error", [RuntimeError("bad sample"), KeyboardInterrupt()])
def test_exception_or_ctrl_c_then_resume(tmp_path, reference, error):
    path = tmp_path / "cap"
    with pytest.raises(type(error)) as info:
        _record(path, _failing(7, error))
    assert "continues from batch 7" in "\n".join(getattr(info.value, "__notes__", []))
    assert clouseau.load(path).calls == tuple(range(7))
    assert_same(_record(path, vectors(40), resume=True), reference)


def test_error_in_the_model_stops_unless_skipped(tmp_path, reference):
    def forward(fmodel, x):
        if forward.calls == 3:
            forward.calls += 1
            raise ValueError("bad batch")
        forward.calls += 1
        return fmodel(x)

    forward.calls = 0
    with pytest.raises(ValueError, match="bad batch"):
        _record(tmp_path / "stop", vectors(40), forward=forward)
    assert clouseau.load(tmp_path / "stop").calls == (0, 1, 2)
    forward.calls = 0
    cap = _record(tmp_path / "skip", vectors(40), forward=forward, on_error="skip")
    assert cap.calls == tuple(k for k in range(40) if k != 3)
    assert "bad batch" in cap.failed_calls[3] and "bad batch" in cap.batches[3].error
    for k in cap.calls:
        np.testing.assert_array_equal(cap.get("act", call=k), reference.get("act", call=k))


def test_full_disk_names_the_batch_to_resume_from(tmp_path, reference, monkeypatch):
    path = tmp_path / "cap"
    real, written = sink_module.write_file, []

    def write_file(file, arrays, metadata):
        if len(written) == 3:
            raise clouseau.CaptureError(
                f"cannot write {file}: {os.strerror(errno.ENOSPC)}; the disk is full"
            )
        written.append(file)
        return real(file, arrays, metadata)

    monkeypatch.setattr(sink_module, "write_file", write_file)
    with pytest.raises(clouseau.CaptureError, match="disk is full") as info:
        _record(path, vectors(40))
    resume_at = len(clouseau.load(path).calls)
    assert f"continues from batch {resume_at}" in str(info.value) and resume_at > 0
    monkeypatch.setattr(sink_module, "write_file", real)
    assert_same(_record(path, vectors(40), resume=True), reference)


def test_a_changed_run_is_refused(tmp_path, reference):
    path = tmp_path / "cap"
    with pytest.raises(RuntimeError):
        _record(path, _failing(10, RuntimeError("stop")))
    other = seeded_mlp()
    with torch.no_grad():
        other.fc2.weight.add_(1.0)
    with pytest.raises(clouseau.CaptureError, match="the model"):
        clouseau.record(other, vectors(40), select=SELECT, path=path, resume=True, stats=True,
                        progress=False, max_size_mb=SIZE)  # fmt: skip
    with pytest.raises(clouseau.CaptureError, match="the selection"):
        _record(path, vectors(40), resume=True, select=["fc1"])
    with pytest.raises(clouseau.CaptureError, match="the length of the data"):
        _record(path, vectors(41), resume=True)
    with pytest.raises(clouseau.CaptureError, match="batch 0 of the data differs"):
        _record(path, vectors(40, seed=5), resume=True)
    assert_same(_record(path, vectors(40), resume=True), reference)
    # A finished recording resumes to itself.
    assert_same(_record(path, vectors(40), resume=True), reference)
