"""clouseau.record by two simulated ranks in one process: the merged capture's batches,
sample numbers and statistics equal those of one process over the same data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import clouseau
from clouseau.dataset import recorder
from clouseau.distributed import Group, RecordPart
from clouseau.distributed.parts import part_summary
from tests.distributed import workload


def _data() -> list[torch.Tensor]:
    # [batch, seq, 8] of varying batch sizes, so the ranks' sample counts differ.
    generator = torch.Generator().manual_seed(2)
    return [torch.randn(size, 3, 8, generator=generator) for size in (2, 3, 1, 4, 2)]


def _record(path, data, **kwargs) -> clouseau.Capture:
    return clouseau.record(
        workload.model(), data, select=workload.SELECT, path=path, rows=True,
        stats=True, progress=False, **kwargs,
    )  # fmt: skip


def _rank(path, rank: int, monkeypatch) -> None:
    def gather(summary: object) -> list[object]:
        other = part_summary(path / "rank-00001", 1) if rank == 0 else None
        return [summary, other] if rank == 0 else [other, summary]

    group = Group("test", rank, 2, gather)
    monkeypatch.setattr(recorder, "record_part", lambda root: RecordPart(root, group))
    _record(path, _data()[rank::2])


@pytest.fixture
def merged(tmp_path, monkeypatch):
    _rank(tmp_path / "run", 1, monkeypatch)  # rank 0 last: it writes the manifest
    _rank(tmp_path / "run", 0, monkeypatch)
    monkeypatch.undo()
    return clouseau.load(tmp_path / "run")


def test_batches_are_merged_in_global_order(merged, tmp_path) -> None:
    single = _record(tmp_path / "single", _data())
    assert merged.missing_ranks == () and merged.closed
    assert merged.batches == single.batches
    assert [(b.start, b.stop) for b in merged.batches][:3] == [(0, 2), (2, 5), (5, 6)]


def test_sample_numbers_count_over_all_ranks(merged, tmp_path) -> None:
    single = _record(tmp_path / "single", _data())
    for call in single.calls:
        np.testing.assert_array_equal(
            merged.get("sample", call=call), single.get("sample", call=call)
        )
    rows = np.concatenate(
        [b["sample"] for b in merged.iter_batches(["fc1", "sample"], 5, shuffle=False)]
    )
    np.testing.assert_array_equal(rows, np.repeat(np.arange(12), 3))


def test_statistics_are_merged_over_all_ranks(merged) -> None:
    eager = torch.cat([torch.relu(workload.model().fc1(b)).reshape(-1, 16) for b in _data()])
    stats = merged.stats("act")
    values = eager.detach().double().numpy()
    assert stats.count == values.shape[0]
    np.testing.assert_allclose(stats.mean, values.mean(0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(stats.var, values.var(0), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(stats.max, values.max(0))
    norms = np.linalg.norm(values, axis=1).mean()
    np.testing.assert_allclose(stats.norm_mean, norms, rtol=1e-6)
    with pytest.raises(KeyError, match="no statistics of 'nope'"):
        merged.stats("nope")
