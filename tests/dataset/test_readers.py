"""Reading a recording back: iter_batches (shuffle, seed, start, formats), array,
to_torch_dataset with workers; and the record options around them (shapes, progress)."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import clouseau  # noqa: E402
from clouseau.dataset.bar import Bar  # noqa: E402
from tests.dataset.models import seeded_mlp, vectors  # noqa: E402


class Tokens(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.emb = torch.nn.Embedding(50, 6)
        self.proj = torch.nn.Linear(6, 6)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.proj(self.emb(ids)) * mask[..., None]


def _token_data(batches=6, b=4, s=5):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(batches):
        lengths = torch.randint(1, s + 1, (b,), generator=g)
        mask = (torch.arange(s)[None, :] < lengths[:, None]).long()
        out.append({"ids": torch.randint(1, 50, (b, s), generator=g) * mask, "mask": mask})
    return out


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    data = _token_data()
    cap = clouseau.record(
        Tokens(), data, select="proj", path=tmp_path_factory.mktemp("tok") / "cap", rows=True,
        mask="mask", fields=["ids"], progress=False,
    )  # fmt: skip
    return cap, data


def test_rows_equal_eager_and_every_row_once(tokens):
    cap, data = tokens
    model = Tokens()
    with torch.no_grad():
        eager = np.concatenate([model.proj(model.emb(d["ids"])).numpy() for d in data])
    ids = np.concatenate([d["ids"].numpy() for d in data])
    n = sum(int(d["mask"].sum()) for d in data)
    for seed in range(3):
        seen = []
        for batch in cap.iter_batches(["proj", "sample", "position", "ids"], 7, seed=seed):
            s, p = batch["sample"], batch["position"]
            np.testing.assert_allclose(batch["proj"], eager[s, p], rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(batch["ids"], ids[s, p])
            seen.extend(zip(s.tolist(), p.tolist(), strict=True))
        assert len(seen) == len(set(seen)) == n


def test_shuffle_is_uniform_deterministic_and_resumable(tokens):
    cap, _ = tokens
    n = len(cap.array("sample"))
    size = 5
    nbatches = -(-n // size)
    where = np.zeros(nbatches)
    for seed in range(400):
        ranks = [
            k
            for k, b in enumerate(cap.iter_batches(["sample", "position"], size, seed=seed))
            if ((b["sample"] == 0) & (b["position"] == 0)).any()
        ]
        assert len(ranks) == 1
        where[ranks[0]] += 1
    # Row (0, 0) lands in each batch about equally often (chi-square, generous bound).
    expected = 400 / nbatches * np.array([min(size, n - k * size) / size for k in range(nbatches)])
    expected *= 400 / expected.sum()
    chi2 = ((where - expected) ** 2 / expected).sum()
    assert chi2 < 3 * nbatches, (where, expected)
    first = list(cap.iter_batches("proj", 4, seed=7))
    again = list(cap.iter_batches("proj", 4, seed=7))
    other = list(cap.iter_batches("proj", 4, seed=8))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    resumed = list(cap.iter_batches("proj", 4, seed=7, start=3))
    assert all(np.array_equal(a, b) for a, b in zip(first[3:], resumed, strict=True))
    dropped = list(cap.iter_batches("proj", 4, seed=7, drop_last=True))
    assert all(len(b) == 4 for b in dropped) and len(dropped) == n // 4


def test_formats_and_sequential_order(tokens):
    cap, _ = tokens
    whole = np.asarray(cap.array("proj"))
    got = np.concatenate(list(cap.iter_batches("proj", 6, shuffle=False)))
    np.testing.assert_array_equal(got, whole)
    batch = next(cap.iter_batches(["proj", "ids"], 6, shuffle=False, format="torch"))
    assert isinstance(batch["proj"], torch.Tensor)
    np.testing.assert_array_equal(batch["proj"].numpy(), whole[:6])
    with pytest.raises(ValueError, match="format must be one of"):
        next(cap.iter_batches("proj", 6, format="tf"))


def test_lazy_array_indexes_like_the_concatenation(tokens):
    cap, _ = tokens
    lazy = cap.array("proj")
    whole = np.concatenate(cap.all_calls("proj"))
    assert lazy.shape == whole.shape and lazy.dtype == whole.dtype and len(lazy) == len(whole)
    np.testing.assert_array_equal(lazy[3], whole[3])
    np.testing.assert_array_equal(lazy[-1], whole[-1])
    np.testing.assert_array_equal(lazy[2:17], whole[2:17])
    np.testing.assert_array_equal(lazy[1:20:3], whole[1:20:3])
    np.testing.assert_array_equal(lazy[[9, 0, 4]], whole[[9, 0, 4]])
    np.testing.assert_array_equal(lazy[2:5, 1], whole[2:5, 1])


def test_array_refuses_rows_of_changing_shape(tmp_path):
    data = [torch.randn(2, s, 8) for s in (3, 4)]
    cap = clouseau.record(seeded_mlp(), data, select="fc1", path=tmp_path / "cap", progress=False)
    assert [a.shape for a in cap.all_calls("fc1")] == [(2, 3, 16), (2, 4, 16)]
    with pytest.raises(clouseau.CaptureError, match="change shape between calls"):
        cap.array("fc1")


def test_torch_dataset_in_a_dataloader_with_workers(tokens):
    cap, _ = tokens
    ds = cap.to_torch_dataset(["proj", "sample", "position"])
    whole = np.asarray(cap.array("proj"))
    assert len(ds) == len(whole)
    np.testing.assert_array_equal(ds[5]["proj"].numpy(), whole[5])
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds), 8, False)
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=2)
    rows = []
    for batch in loader:
        rows.extend(zip(batch["sample"].tolist(), batch["position"].tolist(), strict=True))
    assert len(rows) == len(set(rows)) == len(ds)


def test_batches_of_another_shape_reuse_the_trace_another_dtype_retraces(tmp_path):
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    data = [torch.randn(3, 8), torch.randn(5, 8), torch.randn(3, 8, dtype=torch.float64)]
    cap = clouseau.record(model, data, select="0", path=tmp_path / "a", progress=False)
    assert len(cap.graphs) == 2  # one trace per input structure (dtype), not per shape
    with torch.no_grad():
        for k, x in enumerate(data):
            got = cap.get("0", call=k)
            assert got.dtype == x.numpy().dtype
            np.testing.assert_array_equal(got, model[0](x).numpy())


def test_hugging_face_dataset_through_a_collating_loader(tmp_path):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    texts = [rng.integers(1, 50, size=rng.integers(1, 7)).tolist() for _ in range(30)]
    ds = datasets.Dataset.from_dict({"ids": texts})

    def collate(samples):
        width = max(len(s["ids"]) for s in samples)
        ids = torch.zeros(len(samples), width, dtype=torch.long)
        mask = torch.zeros(len(samples), width, dtype=torch.long)
        for i, s in enumerate(samples):
            ids[i, : len(s["ids"])] = torch.tensor(s["ids"])
            mask[i, : len(s["ids"])] = 1
        return {"ids": ids, "mask": mask}

    loader = torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=collate)
    cap = clouseau.record(
        Tokens(), loader, select="proj", path=tmp_path / "hf", rows=True, mask="mask",
        fields=["ids"], progress=False,
    )  # fmt: skip
    got = {(int(s), int(p)): int(i) for s, p, i in zip(
        cap.array("sample")[:], cap.array("position")[:], cap.array("ids")[:], strict=True
    )}  # fmt: skip
    assert got == {(s, p): t for s, text in enumerate(texts) for p, t in enumerate(text)}
    assert [(b.start, b.stop) for b in cap.batches] == [(0, 8), (8, 16), (16, 24), (24, 30)]


def test_progress_line_only_on_a_terminal(tmp_path, capsys):
    clouseau.record(seeded_mlp(), vectors(3), select="fc1", path=tmp_path / "a")
    assert capsys.readouterr().err == ""  # pytest's stderr is not a TTY

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = Bar(10, True, stream)
    bar.update(3, 12, 2_000_000, force=True)
    bar.close()
    assert "3/10 batches" in stream.getvalue() and "samples/s" in stream.getvalue()
    quiet = Terminal()
    Bar(10, False, quiet).update(3, 12, 0, force=True)
    assert quiet.getvalue() == ""


def test_bad_arguments_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="on_error must be"):
        clouseau.record(seeded_mlp(), vectors(1), path=tmp_path / "a", on_error="ignore")
    with pytest.raises(ValueError, match="needs rows=True"):
        clouseau.record(seeded_mlp(), vectors(1), path=tmp_path / "a", mask="mask")
    batches = [{"x": x, "m": torch.ones(6, 3)} for x in vectors(1)]
    with pytest.raises(ValueError, match="leaving it out of rows="):
        clouseau.record(
            seeded_mlp(), batches, select="fc1", path=tmp_path / "a", rows=True, mask="m",
            forward=lambda fmodel, b: fmodel(b["x"]),
        )  # fmt: skip
    with pytest.raises(KeyError, match="no statistics"):
        clouseau.record(seeded_mlp(), vectors(1), select="fc1", path=tmp_path / "a").stats("fc1")
