"""clouseau.ray.record through the location layer on a local Ray cluster (2 CPUs): a re-run
that fails before its first block keeps the earlier capture, and only clouseau's files of
an earlier run's parts are removed (issue 26, item 7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import clouseau
from tests.distributed import workload

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # starting Ray alone takes 10-20 s here


def _record(path, select=workload.SELECT):
    rows = torch.cat(workload.batches()).numpy()
    dataset = ray.data.from_items([{"x": row} for row in rows], override_num_blocks=3)
    return clouseau.ray.record(
        dataset, workload.model, select=select, path=path, concurrency=2,
        batch_size=workload.BATCH_SIZE, num_cpus=0.5,
    )  # fmt: skip


def test_a_failed_rerun_keeps_the_earlier_capture_and_the_users_files(cluster, tmp_path):
    path = tmp_path / "run"
    _record(path)
    part = sorted(path.glob("part-*"))[0]
    (part / "my-notes.txt").write_text("mine")
    before = workload.snapshot(path)
    with pytest.raises(Exception, match="no_such_point"):
        _record(path, select="no_such_point")
    assert workload.snapshot(path) == before
    workload.assert_equals_eager(clouseau.load(path))
    _record(path)  # a run that writes replaces the earlier parts: their own files only
    assert (part / "my-notes.txt").read_text() == "mine"
    assert sorted(p.name for p in part.iterdir()) == ["my-notes.txt"]
    workload.assert_equals_eager(clouseau.load(path))


def test_rows_fields_and_stats_like_record(cluster, tmp_path):
    # Sequences of 3 positions: rows=["fc1"] stores [batch * 3, 16] rows with their samples.
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(24, 3, 8, generator=generator)
    dataset = ray.data.from_items([{"x": row.numpy()} for row in x], override_num_blocks=3)
    cap = clouseau.ray.record(
        dataset, workload.model, select=workload.SELECT, path=tmp_path / "run",
        concurrency=2, batch_size=4, num_cpus=0.5, rows=["fc1"], fields=["x"], stats=["act"],
    )  # fmt: skip
    model, seen = workload.model(), {"fc1": [], "act": []}
    for name in seen:
        getattr(model, name).register_forward_hook(
            lambda m, a, o, name=name: seen[name].append(o.detach().numpy())
        )
    with torch.no_grad():
        for k in range(6):
            model(x[4 * k : 4 * k + 4])
    assert cap.calls == tuple(range(6))
    for call in cap.calls:
        np.testing.assert_allclose(cap.get("fc1", call=call), seen["fc1"][call].reshape(12, 16))
        inputs = x[4 * call : 4 * call + 4].numpy().reshape(12, 8)  # a field, as rows
        np.testing.assert_array_equal(cap.get("x", call=call), inputs)
        samples = np.repeat(np.arange(4 * call, 4 * call + 4), 3)
        np.testing.assert_array_equal(cap.get("sample", call=call), samples)
        np.testing.assert_array_equal(cap.get("position", call=call), np.tile(np.arange(3), 4))
    acts = np.concatenate(seen["act"]).reshape(-1, 16).astype(np.float64)
    s = cap.stats("act")
    assert s.count == acts.shape[0]
    np.testing.assert_allclose(s.mean, acts.mean(0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(s.var, acts.var(0), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(s.max, acts.max(0))
