"""torchrun (gloo, 2 ranks) through the location layer: every lock before anything is
touched, an earlier capture kept by a run that fails before it traces, an earlier run's
extra parts removed by their own files only, and a warning when every rank records the
same batches (issue 26, items 2, 3 and 6)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import clouseau
from tests.distributed import workload
from tests.distributed.launch import ROOT, env, kill_tree, torchrun

pytestmark = pytest.mark.slow
WORKER = "tests/distributed/_location_worker.py"
SELECT = ",".join(workload.SELECT)


def test_a_failed_rerun_with_fewer_ranks_keeps_the_capture_and_the_users_file(tmp_path):
    path = tmp_path / "run"
    done = torchrun(WORKER, "instrument", str(path), SELECT)
    assert done.returncode == 0, done.stdout[-4000:]
    mine = path / "rank-00001" / "my-notes.txt"
    mine.write_text("mine")
    before = workload.snapshot(path)
    failed = torchrun(WORKER, "instrument", str(path), "no_such_point", nproc=1)
    assert failed.returncode != 0 and "refused:" in failed.stdout
    assert workload.snapshot(path) == before
    cap = clouseau.load(path)
    assert cap.complete and cap.world_size == 2
    workload.assert_equals_eager(cap)
    # A run with one rank that traces replaces the capture: rank 1's own files go, the
    # user's file stays (and load names the part it keeps).
    again = torchrun(WORKER, "instrument", str(path), SELECT, nproc=1)
    assert again.returncode == 0, again.stdout[-4000:]
    assert mine.read_text() == "mine"
    assert sorted(p.name for p in (path / "rank-00001").iterdir()) == ["my-notes.txt"]
    with pytest.raises(clouseau.CaptureError, match="rank-00001 is also there"):
        clouseau.load(path)
    mine.unlink()
    (path / "rank-00001").rmdir()
    workload.assert_equals_eager(clouseau.load(path))


def test_a_second_record_on_a_running_recording_is_refused_before_it_touches_anything(
    tmp_path,
):
    path = tmp_path / "run"
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    args += ["--nproc-per-node=2", str(ROOT / WORKER), "record", str(path), SELECT, "slow"]
    first = subprocess.Popen(
        args, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        manifest = path / "manifest.json"
        while not manifest.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert manifest.exists(), "the first recording never started"
        # One rank: an earlier clouseau removed rank-00001 (of the running run) at once.
        second = torchrun(WORKER, "record", str(path), SELECT, nproc=1)
        assert second.returncode != 0
        assert second.stdout.count("refused:") == 1, second.stdout[-4000:]
        assert (path / "rank-00001").is_dir()
        assert "is being written by process" in second.stdout
        (tmp_path / "run.go").touch()
        out, _ = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            kill_tree(first.pid)
    assert first.returncode == 0, out[-4000:]
    cap = clouseau.load(path)
    assert cap.complete and cap.missing_ranks == ()
    workload.assert_equals_eager(cap)
    assert json.loads(manifest.read_text())["complete"] is True


def test_every_rank_recording_the_whole_data_is_warned_once(tmp_path):
    path = tmp_path / "run"
    done = torchrun(WORKER, "record", str(path), SELECT, "whole")
    assert done.returncode == 0, done.stdout[-4000:]
    assert done.stdout.count("SameBatchesWarning") == 1, done.stdout[-4000:]
    assert "data[rank::world_size]" in done.stdout
    split = torchrun(WORKER, "record", str(tmp_path / "split"), SELECT)
    assert split.returncode == 0 and "SameBatchesWarning" not in split.stdout
    workload.assert_equals_eager(clouseau.load(tmp_path / "split"))
