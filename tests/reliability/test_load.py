"""Long runs: 1,000 calls of an instrumented model with rolling files, in flat memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import clouseau
from tests.reliability.jax_models import Stack, eager_layers
from tests.reliability.models import Small, statm_rss

MiB = 2**20


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    # On a small machine torch's intra-op threads and the store's writer thread fight
    # over the cores and a 1 ms call takes 10; the test is about memory, not speed.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_torch_thread")
def test_torch_thousand_calls_every_call_in_order_and_flat_rss(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Small(width=256)
    # Each call saves x, fc, act (16 kB each) and fc2: ~50 kB, so 1,000 calls put ~50 MB
    # through the store in 0.25 MB files; kept in memory, RSS would grow by about that.
    fmodel = clouseau.instrument(model, path=tmp_path, max_size_mb=0.25)
    base = torch.randn(16, 256)

    def call(i: int) -> torch.Tensor:
        return fmodel(base + i)

    for i in range(100):  # warm up: tracing, the writer thread, allocator pools
        call(i)
    fmodel.flush()
    before = statm_rss()
    for i in range(100, 1100):
        call(i)
    fmodel.flush()
    grown = statm_rss() - before
    fmodel.close()
    print(f"torch: RSS grew by {grown / MiB:.1f} MiB over 1,000 calls")
    assert grown < 16 * MiB, f"RSS grew by {grown / MiB:.1f} MiB"

    cap = clouseau.load(tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) > 100
    assert cap.calls == tuple(range(1100)) and dict(cap.failed_calls) == {}
    names = ("x", "fc", "act", "fc2")
    assert [(r.call, r.name) for r in cap.records] == [(c, n) for c in range(1100) for n in names]
    with torch.no_grad():
        for i in (0, 99, 100, 617, 1099):
            x = base + i
            assert np.array_equal(cap.get("x", call=i), x.numpy())
            assert np.array_equal(cap.get("act", call=i), model.act(model.fc(x)).numpy())
            assert np.array_equal(cap.get("fc2", call=i), model(x).numpy())


def test_jax_thousand_calls_every_call_in_order_and_flat_rss(tmp_path: Path) -> None:
    model = Stack(256, 2)
    fmodel = clouseau.instrument(model, select=["x", "layers.*"], path=tmp_path, max_size_mb=0.1)
    base = np.linspace(-1, 1, 256, dtype=np.float32)
    for i in range(50):
        fmodel(base + i)
    fmodel.flush()
    before = statm_rss()
    for i in range(50, 1050):
        fmodel(base + i)
    fmodel.flush()
    grown = statm_rss() - before
    fmodel.close()
    print(f"jax: RSS grew by {grown / MiB:.1f} MiB over 1,000 calls")
    assert grown < 16 * MiB, f"RSS grew by {grown / MiB:.1f} MiB"

    cap = clouseau.load(tmp_path)
    assert cap.calls == tuple(range(1050))
    assert [r.call for r in cap.records] == sorted(r.call for r in cap.records)
    for i in (0, 50, 321, 1049):
        expected = eager_layers(model, base + i)
        assert np.array_equal(cap.get("x", call=i), base + i)
        for layer in range(2):
            assert np.allclose(cap.get(f"layers.{layer}", call=i), expected[layer], atol=1e-5)
