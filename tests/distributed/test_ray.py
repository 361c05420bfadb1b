"""clouseau.ray.record on a local Ray cluster (2 CPUs, 2 actors): equal to one process,
an actor killed mid-run is retried and nothing is duplicated or lost, resume."""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import runpy
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import clouseau
from clouseau.distributed.blocks import IncompleteBlocksWarning
from clouseau.store.lock import DirectoryLock
from tests.distributed import workload
from tests.distributed.launch import ROOT

ray = pytest.importorskip("ray")

SLOW = pytest.mark.slow  # starting Ray alone takes 10-20 s here

LIMIT_S = 240  # per test: a hung Ray run fails the test instead of the suite


def _timeout(signum: int, frame: object) -> None:
    raise TimeoutError(f"a Ray test ran past {LIMIT_S}s")


@pytest.fixture(autouse=True)
def hard_timeout():
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(LIMIT_S)
    # If the alarm cannot interrupt a call blocked in C, dump the stacks and exit.
    faulthandler.dump_traceback_later(LIMIT_S + 60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _dataset():
    rows = torch.cat(workload.batches()).numpy()  # 24 rows: 3 blocks of 8, batches of 4
    return ray.data.from_items([{"x": row} for row in rows], override_num_blocks=3)


def _record(path: Path, **kwargs):
    return clouseau.ray.record(
        _dataset(), workload.model, select=workload.SELECT, path=path, concurrency=2,
        batch_size=workload.BATCH_SIZE, num_cpus=0.5, **kwargs,
    )  # fmt: skip


def _assert_equals_single_process(cap, tmp_path: Path) -> None:
    single = clouseau.record(
        workload.model(), workload.batches(), select=workload.SELECT,
        path=tmp_path / "single", progress=False,
    )  # fmt: skip
    eager = workload.eager_points()
    assert cap.calls == single.calls == tuple(range(workload.BATCHES))
    for call, points in enumerate(eager):
        for name, value in points.items():
            np.testing.assert_array_equal(cap.get(name, call=call), single.get(name, call=call))
            np.testing.assert_allclose(cap.get(name, call=call), value.numpy(), rtol=1e-6)
    starts = [b.start for b in cap.batches]
    assert starts == [b.start for b in single.batches] == list(range(0, 24, 4))


def kill_once(marker: str, fmodel, batch):
    """Forward that kills its own actor process (SIGKILL) on the batch of rows 12..15,
    once: the batch of rows 8..11 of the same block is on disk by then."""
    x = batch["x"]
    if np.array_equal(x[0].numpy(), torch.cat(workload.batches())[12].numpy()):
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
    return fmodel(x)


@SLOW
def test_ray_record_equals_one_process_and_survives_a_killed_actor(cluster, tmp_path) -> None:
    marker = tmp_path / "killed"
    cap = _record(tmp_path / "run", forward=functools.partial(kill_once, str(marker)))
    assert marker.is_file(), "the actor was never killed"
    pid = int(marker.read_text())
    parts = sorted(p for p in (tmp_path / "run").iterdir() if p.name.startswith("part-"))
    pids = [json.loads((p / "part.json").read_text())["pid"] for p in parts]
    assert pid in pids and len(parts) >= 3, "no actor took over from the killed one"
    _assert_equals_single_process(cap, tmp_path)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["blocks"]) == workload.BATCHES
    files = [b["file"] for b in manifest["blocks"]]
    assert len(set(files)) == len(files)
    on_disk = [f.name for p in parts for f in p.glob("block-*.safetensors")]
    assert set(on_disk) == set(files)  # the dead actor's blocks may be there twice

    # Resume: forget two blocks as if the driver had stopped; only those run again.
    lost = manifest["blocks"][1:3]
    for block in lost:
        (tmp_path / "run" / block["part"] / block["file"]).unlink()
    for file in (tmp_path / "run").glob("part-*/block-*.safetensors"):
        if file.name in {b["file"] for b in lost}:
            file.unlink()  # a duplicate of a lost block
    manifest["blocks"] = [b for b in manifest["blocks"] if b not in lost]
    manifest["complete"] = False
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(IncompleteBlocksWarning, match="4 block"):
        assert len(clouseau.load(tmp_path / "run").calls) == 4
    kept = {b["file"]: b["part"] for b in manifest["blocks"]}
    resumed = _record(tmp_path / "run", resume=True)
    after = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert all(kept[b["file"]] == b["part"] for b in after["blocks"] if b["file"] in kept)
    shutil.rmtree(tmp_path / "single", ignore_errors=True)
    _assert_equals_single_process(resumed, tmp_path)


@SLOW
def test_an_id_column_numbers_the_rows_and_is_not_an_input(cluster, tmp_path) -> None:
    rows = torch.cat(workload.batches()).numpy()
    items = [{"x": row, "n": i} for i, row in enumerate(rows)]
    dataset = ray.data.from_items(items, override_num_blocks=3)
    cap = clouseau.ray.record(
        dataset, workload.model, select=workload.SELECT, path=tmp_path / "run",
        concurrency=2, batch_size=workload.BATCH_SIZE, num_cpus=0.5, id_column="n",
    )  # fmt: skip
    _assert_equals_single_process(cap, tmp_path)  # the model saw x alone: one column


@SLOW
def test_repeated_batches_keep_their_rows_and_resume_reuses_every_file(cluster, tmp_path) -> None:
    rows = torch.cat(workload.batches()).numpy()
    rows[8:12] = rows[0:4]  # batch 2 repeats batch 0: the same content, other rows
    dataset = ray.data.from_items([{"x": row} for row in rows], override_num_blocks=3)
    ordered = dataset.context.execution_options.preserve_order
    batches = [torch.from_numpy(rows[i : i + workload.BATCH_SIZE]) for i in range(0, 24, 4)]
    single = clouseau.record(
        workload.model(), batches, select=workload.SELECT, path=tmp_path / "single",
        progress=False,
    )  # fmt: skip
    path, files = tmp_path / "run", set()
    for resume in (False, True):
        cap = clouseau.ray.record(
            dataset, workload.model, select=workload.SELECT, path=path, concurrency=2,
            batch_size=workload.BATCH_SIZE, num_cpus=0.5, resume=resume,
        )  # fmt: skip
        assert dataset.context.execution_options.preserve_order == ordered  # for the run only
        assert cap.calls == single.calls == tuple(range(6))
        assert [b.start for b in cap.batches] == list(range(0, 24, 4))
        for call in cap.calls:
            for name in single.names():
                want = single.get(name, call=call)
                np.testing.assert_array_equal(cap.get(name, call=call), want)
        written, files = files, set(path.glob("part-*/block-*.safetensors"))
    # Nothing ran again: one file of the repeated content serves both its batches now.
    assert files < written


@SLOW
def test_the_example_runs_as_is(cluster, tmp_path, monkeypatch, capsys) -> None:
    # In this process's cluster (the example starts one only when none is running).
    monkeypatch.setattr(sys, "argv", ["record_ray.py", str(tmp_path / "run"), "--batches", "4"])
    runpy.run_path(str(ROOT / "examples" / "record_ray.py"), run_name="__main__")
    assert "4 call(s)" in capsys.readouterr().out


def test_a_second_run_on_the_path_is_refused(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    lock = DirectoryLock(tmp_path / "run")
    try:
        with pytest.raises(clouseau.CaptureError, match="another instrumented model"):
            clouseau.ray.record(None, workload.model, path=tmp_path / "run")
    finally:
        lock.release()


def test_a_manifest_that_lists_a_missing_block_is_refused(tmp_path) -> None:
    root = tmp_path / "run"
    (root / "part-000000000000").mkdir(parents=True)
    (root / "part-000000000000" / "part.json").write_text("{}")
    block = {"part": "part-000000000000", "file": f"block-{0:012d}-{'0' * 16}.safetensors"}
    manifest = {"format": "clouseau.blocks/1", "run": {}, "complete": True}
    manifest["blocks"] = [block | {"rows": [[0, 4]]}]
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(clouseau.CaptureError, match="which is not there"):
        clouseau.load(root)


def test_a_manifest_with_two_blocks_of_the_same_rows_is_refused(tmp_path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    blocks = [
        {"part": "part-000000000000", "file": f"block-{0:012d}-{'0' * 16}.safetensors"},
        {"part": "part-000000000001", "file": f"block-{2:012d}-{'1' * 16}.safetensors"},
    ]
    blocks[0]["rows"], blocks[1]["rows"] = [[0, 4]], [[2, 6]]
    manifest = {"format": "clouseau.blocks/1", "run": {}, "complete": True, "blocks": blocks}
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(clouseau.CaptureError, match="hold the same rows"):
        clouseau.load(root)
