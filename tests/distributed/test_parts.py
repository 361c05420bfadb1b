"""A capture in parts, written by two simulated ranks in one process (no process group)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture import torch as torch_frontend
from clouseau.distributed import Group, IncompleteCaptureWarning, open_sink
from clouseau.distributed.parts import part_summary
from tests.distributed import workload


def _rank(path, rank: int, *, close: bool = True, peer_died: bool = False):
    """Rank ``rank`` of 2 over its batches ``rank::2``; rank 0 runs last (it gathers)."""

    def gather(summary: object) -> list[object]:
        if not isinstance(summary, dict):  # the locks' outcomes, at the start
            return [summary, None] if rank == 0 else [None, summary]
        if peer_died:  # the peer dies after the start: the closing gather fails
            raise RuntimeError("Connection closed by peer")
        other = part_summary(path / "rank-00001", 1) if rank == 0 else None
        return [summary, other] if rank == 0 else [other, summary]

    sink = open_sink(path, group=Group("test", rank, 2, gather))
    fmodel = torch_frontend.instrument(workload.model(), select=workload.SELECT, sink=sink)
    with torch.no_grad():
        for batch in workload.batches()[rank::2]:
            fmodel(batch)
    if close:
        fmodel.close()
    else:
        fmodel.flush()
    return fmodel  # a process that died never closes: the caller keeps it open


@pytest.fixture
def parted(tmp_path):
    _rank(tmp_path, 1)
    _rank(tmp_path, 0)
    return tmp_path


def test_parts_load_as_one_capture_in_batch_order(parted) -> None:
    cap = clouseau.load(parted)
    assert cap.world_size == 2 and cap.missing_ranks == ()
    assert cap.calls == tuple(range(workload.BATCHES))
    assert cap.complete and not cap.partial_calls
    assert dict(cap.ranks) == {c: c % 2 for c in range(workload.BATCHES)}
    for call, eager in enumerate(workload.eager_points()):
        for name in workload.SELECT:
            np.testing.assert_allclose(cap.get(name, call=call), eager[name].numpy(), rtol=1e-6)
    assert "from 2 processes" in repr(cap)


def test_one_part_loads_alone_with_its_own_calls(parted) -> None:
    cap = clouseau.load(parted / "rank-00001")
    assert cap.calls == (0, 1, 2)  # the rank's batches 1, 3, 5
    assert cap.complete


def test_a_part_that_never_closed_is_reported(tmp_path) -> None:
    dead = _rank(tmp_path, 1, close=False)
    with pytest.warns(IncompleteCaptureWarning, match="manifest of .* stays incomplete"):
        _rank(tmp_path, 0, peer_died=True)
    with pytest.warns(IncompleteCaptureWarning, match=r"rank\(s\) \[1\] of 2"):
        cap = clouseau.load(tmp_path)
    assert cap.missing_ranks == (1,)
    assert cap.calls == tuple(range(workload.BATCHES))  # what rank 1 flushed is usable
    eager = workload.eager_points()
    np.testing.assert_allclose(cap.get("fc1", call=3), eager[3]["fc1"].numpy(), rtol=1e-6)
    assert not cap.closed
    dead.close()


def test_parts_without_a_manifest_load_with_a_warning(tmp_path) -> None:
    dead = _rank(tmp_path, 1, close=False)
    with pytest.warns(IncompleteCaptureWarning, match=r"rank\(s\) \[0, 1\] of 2"):
        cap = clouseau.load(tmp_path)
    assert cap.calls == (1, 3, 5)
    assert not cap.partial_calls
    dead.close()


def test_a_file_missing_from_a_part_is_a_capture_error(parted) -> None:
    next((parted / "rank-00001").glob("*.safetensors")).unlink()
    with pytest.raises(clouseau.CaptureError, match=r"manifest.json disagrees with rank-00001"):
        clouseau.load(parted)


def test_a_part_the_manifest_lists_but_is_gone_is_a_capture_error(parted) -> None:
    shutil.rmtree(parted / "rank-00001")
    with pytest.raises(clouseau.CaptureError, match="lists rank-00001, which is not there"):
        clouseau.load(parted)


def test_a_stray_part_is_a_capture_error(parted) -> None:
    shutil.copytree(parted / "rank-00001", parted / "rank-00002")
    with pytest.raises(clouseau.CaptureError, match="rank-00002 is also there"):
        clouseau.load(parted)


def test_parts_of_another_run_are_a_capture_error(parted) -> None:
    about = parted / "rank-00001" / "part.json"
    about.write_text(json.dumps({**json.loads(about.read_text()), "world_size": 4}))
    with pytest.raises(clouseau.CaptureError, match="parts of different runs are mixed"):
        clouseau.load(parted)


def test_a_damaged_manifest_is_a_capture_error(parted) -> None:
    (parted / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(clouseau.CaptureError, match="is not a clouseau manifest"):
        clouseau.load(parted)


def test_a_new_run_with_fewer_ranks_removes_the_old_parts(parted) -> None:
    def alone(summary: object) -> list[object]:
        return [summary]

    sink = open_sink(parted, group=Group("test", 0, 1, alone))
    fmodel = torch_frontend.instrument(workload.model(), select="fc1", sink=sink)
    with torch.no_grad(), fmodel:
        fmodel(workload.batches()[0])
    assert not (parted / "rank-00001").exists()
    assert clouseau.load(parted).calls == (0,)


def test_two_runs_on_one_path_are_refused(tmp_path) -> None:
    def alone(summary: object) -> list[object]:
        return [summary]

    first = open_sink(tmp_path, group=Group("test", 0, 1, alone))
    with pytest.raises(clouseau.CaptureError, match="written by"):
        open_sink(tmp_path, group=Group("test", 0, 1, alone))
    first.close()
    open_sink(tmp_path, group=Group("test", 0, 1, alone)).close()
