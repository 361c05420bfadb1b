"""GPT-2 over a few thousand token sequences: rows, padding, token ids, shuffle, statistics.

Every recorded row is compared with the eager model's value at its (sample, position),
taken by forward hooks on the two blocks.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import clouseau  # noqa: E402
from tests.dataset.models import SEQ, gpt2, token_batches  # noqa: E402

pytestmark = pytest.mark.slow  # GPT-2 traces through torch.export (about 10 s)

BLOCKS = ("h.0", "h.1")


def _eager(model, batches):
    """{block: [samples, SEQ, d]} from forward hooks on the eager model."""
    out = {name: [] for name in BLOCKS}
    hooks = [
        model.h[i].register_forward_hook(
            lambda m, a, o, name=name: out[name].append(
                (o[0] if isinstance(o, tuple) else o).detach().numpy().copy()
            )
        )
        for i, name in enumerate(BLOCKS)
    ]
    with torch.no_grad():
        for batch in batches:
            model(**batch)
    for hook in hooks:
        hook.remove()
    return {name: np.concatenate(arrays) for name, arrays in out.items()}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    model = gpt2()
    batches = token_batches(2000, 250)
    path = tmp_path_factory.mktemp("gpt2") / "cap"
    cap = clouseau.record(
        model, batches, select=list(BLOCKS), path=path, rows=True, mask="attention_mask",
        fields=["input_ids"], stats=True, progress=False, max_size_mb=1.5,
    )  # fmt: skip
    return cap, batches, _eager(model, batches)


def test_every_row_once_per_epoch_equal_to_eager(recorded):
    cap, batches, eager = recorded
    ids = np.concatenate([b["input_ids"].numpy() for b in batches])
    mask = np.concatenate([b["attention_mask"].numpy() for b in batches]).astype(bool)
    names = [*BLOCKS, "sample", "position", "input_ids"]
    seen = []
    for batch in cap.iter_batches(names, batch_size=500, shuffle=True, seed=3):
        s, p = batch["sample"], batch["position"]
        assert mask[s, p].all(), "a padding position was recorded"
        np.testing.assert_array_equal(batch["input_ids"], ids[s, p])
        for name in BLOCKS:
            np.testing.assert_allclose(batch[name], eager[name][s, p], rtol=1e-6, atol=1e-6)
        seen.append(s * SEQ + p)
    seen = np.concatenate(seen)
    assert len(seen) == mask.sum() == len(np.unique(seen))


def test_batches_know_their_samples(recorded):
    cap, batches, _ = recorded
    assert [b.index for b in cap.batches] == list(range(len(batches))) == list(cap.calls)
    starts = np.cumsum([0] + [len(b["input_ids"]) for b in batches])
    assert [(b.start, b.stop) for b in cap.batches] == list(itertools.pairwise(starts))
    assert len(list(Path(cap.path).glob("*.safetensors"))) > 1  # rolled, whole batches


def test_statistics_equal_numpy(recorded):
    cap, _, _ = recorded
    for name in BLOCKS:
        rows = np.asarray(cap.array(name), dtype=np.float64)
        stats = cap.stats(name)
        assert stats.count == len(rows)
        np.testing.assert_allclose(stats.mean, rows.mean(0), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(stats.var, rows.var(0), rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(stats.min, rows.min(0))
        np.testing.assert_array_equal(stats.max, rows.max(0))
        assert stats.norm_mean == pytest.approx(np.linalg.norm(rows, axis=1).mean(), rel=1e-10)


def test_arrow_and_parquet_read_back(recorded, tmp_path):
    import pyarrow.parquet as pq

    cap, _, _ = recorded
    names = ["h.1", "sample", "position", "input_ids"]
    files = cap.to_parquet(tmp_path / "pq", names, rows_per_file=10_000)
    table = pq.read_table(tmp_path / "pq")
    assert len(files) > 1 and table.num_rows == len(cap.array("h.1"))
    for name in names:
        expected = np.asarray(cap.array(name))
        column = table.column(name).combine_chunks()
        flat = column.flatten() if expected.ndim > 1 else column
        got = flat.to_numpy().reshape(expected.shape)
        np.testing.assert_array_equal(got, expected)
    ds = cap.to_hf_dataset(names, directory=tmp_path / "hf", rows_per_file=10_000)
    assert ds.num_rows == table.num_rows
    columns = ds.with_format("numpy")[:]
    for name in names:
        np.testing.assert_array_equal(np.stack(columns[name]), np.asarray(cap.array(name)))
