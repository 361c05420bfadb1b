"""clouseau.ray.record through the location layer on a local Ray cluster (2 CPUs): a re-run
that fails before its first block keeps the earlier capture, and only clouseau's files of
an earlier run's parts are removed (issue 26, item 7)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import clouseau
from tests.distributed import workload
from tests.distributed.launch import ROOT

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # starting Ray alone takes 10-20 s here


@pytest.fixture(scope="module")
def cluster():
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


def _record(path, select=workload.SELECT):
    rows = torch.cat(workload.batches()).numpy()
    dataset = ray.data.from_items([{"x": row} for row in rows], override_num_blocks=3)
    return clouseau.ray.record(
        dataset, workload.model, select=select, path=path, concurrency=2,
        batch_size=workload.BATCH_SIZE, num_cpus=0.5,
    )  # fmt: skip


def _snapshot(path):
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != ".clouseau.lock")
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in files}


def _assert_equals_eager(cap) -> None:
    assert cap.calls == tuple(range(workload.BATCHES))
    for call, eager in enumerate(workload.eager_points()):
        for name in workload.SELECT:
            np.testing.assert_allclose(cap.get(name, call=call), eager[name].numpy(), rtol=1e-6)


def test_a_failed_rerun_keeps_the_earlier_capture_and_the_users_files(cluster, tmp_path):
    path = tmp_path / "run"
    _record(path)
    part = sorted(path.glob("part-*"))[0]
    (part / "my-notes.txt").write_text("mine")
    before = _snapshot(path)
    with pytest.raises(Exception, match="no_such_point"):
        _record(path, select="no_such_point")
    assert _snapshot(path) == before
    _assert_equals_eager(clouseau.load(path))
    _record(path)  # a run that writes replaces the earlier parts: their own files only
    assert (part / "my-notes.txt").read_text() == "mine"
    assert sorted(p.name for p in part.iterdir()) == ["my-notes.txt"]
    _assert_equals_eager(clouseau.load(path))
