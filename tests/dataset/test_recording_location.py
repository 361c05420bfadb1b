"""A recording's directory through the location layer: an earlier recording survives a run
that fails before it traces, only the files a recording lists are ever removed, a finished
recording is left alone by resume, and resume notices any change of the weights or of
``forward=`` (issue 26, items 1, 9, 13, 14, 17 and "recordings that know what they hold")."""

from __future__ import annotations

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
from clouseau.store import DamagedCaptureWarning  # noqa: E402
from tests.dataset.models import seeded_mlp, vectors  # noqa: E402

SELECT = ["fc1", "act"]
ROOT = Path(__file__).resolve().parents[2]


def _record(path, data, model=None, **kwargs):
    options = {"select": SELECT, "path": path, "progress": False, "max_size_mb": 0.0015}
    return clouseau.record(model or seeded_mlp(), data, **{**options, **kwargs})


def _eager(model, data, name="fc1"):
    seen = []
    handle = getattr(model, name).register_forward_hook(
        lambda m, a, o: seen.append(o.detach().numpy().copy())
    )
    with torch.no_grad():
        for x in data:
            model(x)
    handle.remove()
    return seen


def _snapshot(path):
    # The lock file holds who locked last; everything else must stay byte for byte.
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name != ".clouseau.lock")
    return {p.name: p.read_bytes() for p in files}


def test_a_select_typo_keeps_the_earlier_recording(tmp_path) -> None:
    data = vectors(4)
    _record(tmp_path, data)
    before = _snapshot(tmp_path)
    with pytest.raises(clouseau.SelectionError):
        _record(tmp_path, data, select="no_such_layer")
    assert _snapshot(tmp_path) == before
    cap = clouseau.load(tmp_path, strict=True)
    assert cap.complete and cap.calls == (0, 1, 2, 3)
    for call, expected in enumerate(_eager(seeded_mlp(), data)):
        np.testing.assert_array_equal(cap.get("fc1", call=call), expected)


@pytest.mark.parametrize("name", ["NOTES.md", "status-before-finetune.json", "graph-notes.json"])
def test_a_file_that_mentions_the_format_is_never_removed(tmp_path, name) -> None:
    data = vectors(3)
    _record(tmp_path, data)
    planted = tmp_path / name
    planted.write_text('{"format": "clouseau.capture/1"} "clouseau.record/1" notes')
    _record(tmp_path, data)  # replaces its own recording
    assert planted.read_text().endswith("notes")
    assert clouseau.load(tmp_path, strict=True).calls == (0, 1, 2)


def test_resume_of_a_finished_recording_changes_nothing(tmp_path) -> None:
    data = vectors(5)
    _record(tmp_path, data)
    before = _snapshot(tmp_path)
    cap = _record(tmp_path, data, resume=True)
    assert _snapshot(tmp_path) == before
    assert cap.complete and cap.calls == tuple(range(5))


def test_resume_repairs_a_status_that_a_kill_left_open(tmp_path) -> None:
    data = vectors(5)
    _record(tmp_path, data)
    status_file = tmp_path / "status.json"
    status = json.loads(status_file.read_text())
    # A kill between record.json (done) and status.json: the status still says open.
    status_file.write_text(json.dumps({**status, "closed": False}))
    assert not clouseau.load(tmp_path).closed
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    cap = _record(tmp_path, data, resume=True)
    assert cap.closed and cap.complete and cap.calls == tuple(range(5))
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == files


# The recording of 5 batches, stopped once record.json says done and before status.json
# does: the final status write signals the parent (a marker file) and waits to be killed.
KILLED_BEFORE_STATUS = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import clouseau
    from clouseau.dataset.directory import Directory
    from tests.dataset.models import seeded_mlp, vectors

    write_status = Directory.write_status

    def stop_before_the_final_status(self, progress, graphs):
        if not progress.done:
            return write_status(self, progress, graphs)
        Path(sys.argv[2]).write_text("record.json is done")
        time.sleep(600)

    Directory.write_status = stop_before_the_final_status
    clouseau.record(seeded_mlp(), vectors(5), select=["fc1", "act"], path=sys.argv[1],
                    progress=False, max_size_mb=0.0015)
    """
)


def _kill_before_the_final_status(path, marker) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", KILLED_BEFORE_STATUS, str(path), str(marker)]
    child = subprocess.Popen(cmd, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), f"the child never reached the final status (exit {child.poll()})"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_a_real_kill_between_record_and_status_is_repaired_by_resume(tmp_path) -> None:
    data, path = vectors(5), tmp_path / "cap"
    _kill_before_the_final_status(path, tmp_path / "marker")
    assert json.loads((path / "record.json").read_text())["done"] is True
    assert json.loads((path / "status.json").read_text())["closed"] is False
    assert not clouseau.load(path).closed  # left so until a resume repairs it
    files = sorted(p.name for p in path.glob("*.safetensors"))
    cap = _record(path, data, resume=True)
    assert cap.closed and cap.complete and cap.calls == tuple(range(5))
    assert sorted(p.name for p in path.glob("*.safetensors")) == files
    repaired = _snapshot(path)
    again = _record(path, data, resume=True)  # a finished recording: nothing changes
    assert _snapshot(path) == repaired
    loaded = clouseau.load(path, strict=True)
    for name in SELECT:
        expected = _eager(seeded_mlp(), data, name)
        for got in (cap, again, loaded):
            assert len(got.all_calls(name)) == len(expected)
            for call, want in enumerate(expected):
                np.testing.assert_array_equal(got.get(name, call=call), want)
            np.testing.assert_array_equal(got.array(name)[:], np.concatenate(expected))


def test_resume_refuses_a_change_that_misses_a_sample_of_the_weights(tmp_path) -> None:
    class Wide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc1 = torch.nn.Linear(1024, 1024)
            self.act = torch.nn.ReLU()

        def forward(self, x):
            return self.act(self.fc1(x))

    data = [torch.randn(2, 1024, generator=torch.Generator().manual_seed(k)) for k in range(3)]

    class Interrupted:
        def __len__(self) -> int:
            return 3

        def __iter__(self):
            yield data[0]
            raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        _record(tmp_path, Interrupted(), model=Wide(), max_size_mb=0.001)
    changed = Wide()
    with torch.no_grad():
        changed.fc1.weight[:, 1] = 0  # one input column: a strided sample never sees it
    with pytest.raises(clouseau.CaptureError, match=r"the model .* changed"):
        _record(tmp_path, data, model=changed, resume=True, max_size_mb=0.001)
    cap = _record(tmp_path, data, model=Wide(), resume=True, max_size_mb=0.001)
    for call, expected in enumerate(_eager(Wide(), data)):
        np.testing.assert_array_equal(cap.get("fc1", call=call), expected)


def test_resume_refuses_a_changed_forward(tmp_path) -> None:
    data = vectors(4)

    def first(fmodel, batch):
        return fmodel(batch)

    def second(fmodel, batch):
        return fmodel(batch * 2)

    class Interrupted:
        def __len__(self) -> int:
            return 4

        def __iter__(self):
            yield from data[:2]
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _record(tmp_path, Interrupted(), forward=first)
    with pytest.raises(clouseau.CaptureError, match=r"forward= .* changed"):
        _record(tmp_path, data, forward=second, resume=True)
    cap = _record(tmp_path, data, forward=first, resume=True)
    assert cap.complete and cap.calls == (0, 1, 2, 3)
    for call, expected in enumerate(_eager(seeded_mlp(), data)):
        np.testing.assert_array_equal(cap.get("fc1", call=call), expected)


def test_a_skipped_data_error_can_be_resumed(tmp_path) -> None:
    data = vectors(6)

    class Data:
        def __init__(self, stop_after):
            self.stop_after = stop_after

        def __len__(self) -> int:
            return 6

        def __iter__(self):
            # A generator ends at its first exception: a loader that fails on one batch
            # and goes on is an iterator object.
            return _Iterator(self.stop_after)

    class _Iterator:
        def __init__(self, stop_after):
            self.k, self.stop_after = 0, stop_after

        def __next__(self):
            k, self.k = self.k, self.k + 1
            if k >= len(data):
                raise StopIteration
            if k == 2:
                raise ValueError("corrupt sample in batch 2")
            if self.stop_after is not None and k > self.stop_after:
                raise KeyboardInterrupt
            return data[k]

    with pytest.raises(KeyboardInterrupt):
        _record(tmp_path, Data(3), on_error="skip")
    cap = _record(tmp_path, Data(None), on_error="skip", resume=True)
    assert cap.complete and 2 in cap.failed_calls
    expected = _eager(seeded_mlp(), [x for k, x in enumerate(data) if k != 2])
    kept = [c for c in cap.calls if c != 2]
    for call, value in zip(kept, expected, strict=True):
        np.testing.assert_array_equal(cap.get("fc1", call=call), value)


def test_the_status_lists_the_files_and_a_missing_one_is_damaged(tmp_path) -> None:
    data = vectors(8)
    _record(tmp_path, data)
    status = json.loads((tmp_path / "status.json").read_text())
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert status["files"] == files and len(files) >= 3
    (tmp_path / files[1]).unlink()
    with pytest.warns(DamagedCaptureWarning):
        cap = clouseau.load(tmp_path)
    assert not cap.complete and files[1] in cap.damaged
    with pytest.raises(clouseau.CaptureError, match=files[1]):
        clouseau.load(tmp_path, strict=True)


def test_a_file_missing_from_an_interrupted_recording_is_damaged(tmp_path) -> None:
    data = vectors(8)

    class Interrupted:
        def __len__(self) -> int:
            return 8

        def __iter__(self):
            yield from data[:6]
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _record(tmp_path, Interrupted())
    recorded = json.loads((tmp_path / "record.json").read_text())["files"]
    assert len(recorded) >= 2
    (tmp_path / recorded[0]).unlink()
    with pytest.warns(DamagedCaptureWarning, match=f"{recorded[0]}: missing: "):
        cap = clouseau.load(tmp_path)
    assert not cap.complete and recorded[0] in cap.damaged
