"""torchrun with 2 ranks (gloo, CPU): the merged capture equals one process over the same data."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import clouseau
from clouseau.distributed import IncompleteCaptureWarning, PartedCapture
from clouseau.store.rows import columns
from tests.distributed import workload
from tests.distributed.launch import run, torchrun

pytestmark = pytest.mark.slow
WORKER = "tests/distributed/_torchrun_worker.py"


def _single_process(path) -> clouseau.Capture:
    fmodel = clouseau.instrument(workload.model(), select=workload.SELECT, path=path)
    with torch.no_grad(), fmodel:
        for batch in workload.batches():
            fmodel(batch)
    return clouseau.load(path)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process(tmp_path, mode) -> None:
    done = torchrun(WORKER, mode, str(tmp_path / "run"))
    assert done.returncode == 0, done.stdout[-4000:]
    merged = clouseau.load(tmp_path / "run")
    single = _single_process(tmp_path / "single")
    assert isinstance(merged, PartedCapture)
    assert merged.world_size == 2 and merged.missing_ranks == ()
    assert merged.calls == single.calls == tuple(range(workload.BATCHES))
    assert [merged.rank(c) for c in merged.calls] == [0, 1, 0, 1, 0, 1]
    assert merged.names() == single.names()
    for call, eager in enumerate(workload.eager_points()):
        for name in workload.SELECT:
            np.testing.assert_array_equal(merged.get(name, call=call), single.get(name, call=call))
            np.testing.assert_allclose(merged.get(name, call=call), eager[name].numpy(), rtol=1e-6)


def test_a_dead_rank_is_reported_and_the_rest_is_usable(tmp_path) -> None:
    done = torchrun(WORKER, "plain", str(tmp_path / "run"), "1")
    assert done.returncode != 0
    with pytest.warns(IncompleteCaptureWarning, match=r"rank\(s\) \[1\] of 2"):
        merged = clouseau.load(tmp_path / "run")
    assert merged.missing_ranks == (1,)
    eager = workload.eager_points()
    # Rank 0 ran batches 0, 2, 4; rank 1 flushed batch 1 before it died.
    assert merged.calls == (0, 1, 2, 4)
    for call in merged.calls:
        np.testing.assert_allclose(merged.get("fc1", call=call), eager[call]["fc1"].numpy())


def test_the_example_script_runs_as_documented(tmp_path) -> None:
    sizes = ["--batches", "6", "--batch-size", "4", "--width", "16"]
    example = "examples/record_torchrun.py"
    done = torchrun(example, str(tmp_path / "ranks"), "--fsdp", *sizes)
    assert done.returncode == 0, done.stdout[-4000:]
    single = run([sys.executable, example, str(tmp_path / "one"), *sizes], timeout=120)
    assert single.returncode == 0, single.stdout[-4000:]
    ranks, one = clouseau.load(tmp_path / "ranks"), clouseau.load(tmp_path / "one")
    assert ranks.calls == one.calls == tuple(range(6)) and ranks.names() == one.names()
    for name in one.names():
        for call in one.calls:
            np.testing.assert_allclose(ranks.get(name, call=call), one.get(name, call=call))


def test_record_killed_on_one_rank_then_resumed_equals_one_process(tmp_path) -> None:
    worker = "tests/distributed/_record_worker.py"
    died = torchrun(worker, str(tmp_path / "run"), "2")
    assert died.returncode != 0
    resumed = torchrun(worker, str(tmp_path / "run"), "resume")
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    merged = clouseau.load(tmp_path / "run")
    single = clouseau.record(
        workload.model(),
        workload.batches(),
        select=workload.SELECT,
        path=tmp_path / "single",
        progress=False,
    )
    assert merged.missing_ranks == () and merged.closed
    assert merged.calls == single.calls == tuple(range(workload.BATCHES))
    assert [merged.rank(c) for c in merged.calls] == [0, 1, 0, 1, 0, 1]
    eager = workload.eager_points()
    for call in merged.calls:
        for name in workload.SELECT:
            assert len(merged.entries) == len(single.entries)  # nothing duplicated
            np.testing.assert_array_equal(merged.get(name, call=call), single.get(name, call=call))
            np.testing.assert_allclose(merged.get(name, call=call), eager[call][name].numpy())
    # The row readers map the parts' files, as load found them (not every row in memory).
    for name in workload.SELECT:
        (column,) = columns(merged, (name,))
        assert all(chunk.file is not None for chunk in column.chunks)
        rows = np.concatenate(single.all_calls(name))
        np.testing.assert_array_equal(np.asarray(merged.array(name)), rows)
        batches = merged.iter_batches(name, 5, shuffle=False)
        np.testing.assert_array_equal(np.concatenate(list(batches)), rows)
        dataset = merged.to_torch_dataset(name)
        np.testing.assert_array_equal(dataset[list(range(len(rows)))].numpy(), rows)
