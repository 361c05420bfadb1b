"""Faults inside the model: exceptions and Ctrl-C mid-run, and threads (issue 7).

After a call fails, the calls before it are complete and load from disk, ``failed_calls``
says which call failed and why, and the instrumented model keeps working.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import clouseau
from clouseau.capture.torch import mark_leaf
from tests.reliability.jax_models import Stack, eager_layers
from tests.reliability.models import Deep, WithFailing, eager_blocks

TRIGGER = 999.0


def _inputs(n: int, fail_at: int) -> list[torch.Tensor]:
    xs = [torch.randn(2, 4) for _ in range(n)]
    xs[fail_at][0, 0] = TRIGGER  # the leaf raises on this call only
    return xs


@pytest.mark.parametrize(
    ("error", "expected"),
    [(RuntimeError("boom on purpose"), "RuntimeError: boom on purpose"),
     (KeyboardInterrupt(), "KeyboardInterrupt")],
)  # fmt: skip
def test_torch_exception_inside_forward_keeps_earlier_calls(
    error: BaseException, expected: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = WithFailing(error)
    mark_leaf(model.fail)
    xs = _inputs(5, fail_at=2)
    fmodel = clouseau.instrument(model, select=["x", "fc"], path=tmp_path, max_size_mb=0.001)
    outs: dict[int, torch.Tensor] = {}
    for call, x in enumerate(xs):
        if call == 2:
            with pytest.raises(type(error)) as info:
                fmodel(x)
            assert info.value is error  # propagates as raised, not wrapped
            # Earlier calls are on disk and load while the model is still open.
            fmodel.flush()
            early = clouseau.load(tmp_path)
            assert early.calls == (0, 1)
            assert early.failed_calls == {2: expected}
        else:
            outs[call] = fmodel(x)
    fmodel.close()

    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 1, 3, 4)
    assert dict(cap.failed_calls) == {2: expected}
    with torch.no_grad():
        for call, out in outs.items():
            x = xs[call]
            assert torch.equal(out, model(x))
            assert np.array_equal(cap.get("x", call=call), x.numpy())
            assert np.array_equal(cap.get("fc", call=call), model.fc(x * 2).numpy())


def _host(x: np.ndarray) -> np.ndarray:
    if (x == TRIGGER).any():
        raise RuntimeError("host boom on purpose")
    return np.asarray(x) * 2


def with_callback(x: jax.Array) -> jax.Array:
    y = jnp.sin(x)
    z = jax.pure_callback(_host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return jax.nn.relu(y + z)


def test_jax_failure_while_running_keeps_earlier_calls(tmp_path: Path) -> None:
    xs = [np.full(3, float(i), np.float32) for i in range(5)]
    xs[2][1] = TRIGGER
    fmodel = clouseau.instrument(with_callback, path=tmp_path)
    outs = {}
    for call, x in enumerate(xs):
        if call == 2:
            with pytest.raises(Exception, match="host boom on purpose"):
                fmodel(x)
            fmodel.flush()
            assert clouseau.load(tmp_path).calls == (0, 1)
        else:
            outs[call] = np.asarray(fmodel(x))
    fmodel.close()
    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 1, 3, 4)
    assert list(cap.failed_calls) == [2] and "host boom on purpose" in cap.failed_calls[2]
    for call, out in outs.items():
        assert np.array_equal(out, np.asarray(with_callback(xs[call])))
        assert np.array_equal(cap.get("x", call=call), xs[call])
        assert np.array_equal(cap.get("relu", call=call), out)


def test_jax_keyboard_interrupt_while_fetching_keeps_earlier_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C lands while the saved values come back from the device.
    real_get = jax.device_get
    interrupt = {"now": False}

    def device_get(tree: Any) -> Any:
        if interrupt["now"]:
            raise KeyboardInterrupt
        return real_get(tree)

    monkeypatch.setattr(jax, "device_get", device_get)
    model = Stack(8, 2)
    xs = [np.full(8, i / 10, np.float32) for i in range(4)]
    with clouseau.instrument(model, select="layers.*", path=tmp_path) as fmodel:
        fmodel(xs[0])
        interrupt["now"] = True
        with pytest.raises(KeyboardInterrupt):
            fmodel(xs[1])
        interrupt["now"] = False
        fmodel(xs[2])
    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 2) and dict(cap.failed_calls) == {1: "KeyboardInterrupt"}
    for call in (0, 2):
        expected = eager_layers(model, xs[call])
        for i in range(2):
            assert np.allclose(cap.get(f"layers.{i}", call=call), expected[i], atol=1e-6)


def test_jax_keyboard_interrupt_while_tracing_propagates(tmp_path: Path) -> None:
    def model(x: jax.Array) -> jax.Array:
        if x.shape[0] == 3:  # Ctrl-C while the new shape is traced
            raise KeyboardInterrupt
        return jnp.tanh(x)

    with clouseau.instrument(model, path=tmp_path) as fmodel:
        fmodel(np.ones(2, np.float32))
        with pytest.raises(KeyboardInterrupt):
            fmodel(np.ones(3, np.float32))
        fmodel(np.zeros(2, np.float32))
    cap = clouseau.load(tmp_path)
    assert cap.calls == (0, 1)
    assert np.array_equal(cap.get("tanh", call=1), np.zeros(2, np.float32))


def _race(worker: Callable[[int], None], threads: int) -> None:
    """Run ``worker(t)`` in ``threads`` threads released at once; re-raise any error."""
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            barrier.wait()
            worker(t)
        except BaseException as err:  # every error, reported below
            errors.append(err)

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert not errors, errors


def test_torch_threads_calling_one_model(tmp_path: Path) -> None:
    # The first calls race on lazy tracing, and three shapes keep new signatures being
    # traced (torch.fx patches nn.Module process-wide) while other threads run.
    torch.manual_seed(0)
    model = Deep()
    fmodel = clouseau.instrument(model, path=tmp_path, max_size_mb=0.01)
    outs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def worker(t: int) -> None:
        for i in range(12):
            x = torch.full((1 + (t + i) % 3, 16), (100 * t + i) / 1000)
            outs[t, i] = (x, fmodel(x))

    _race(worker, threads=4)
    fmodel.close()
    cap = clouseau.load(tmp_path)
    assert cap.calls == tuple(range(48)) and dict(cap.failed_calls) == {}
    assert len(cap.graphs) == 1  # traced once per structure: three shapes, one graph
    seen = set()
    for call in cap.calls:
        x = torch.from_numpy(cap.get("x", call=call))
        code = round(x[0, 0].item() * 1000)  # 100 * thread + index
        key = (code // 100, code % 100)
        seen.add(key)
        expected_x, out = outs[key]
        assert torch.equal(x, expected_x)  # the right call's input ...
        for block, value in enumerate(eager_blocks(model, x)):  # ... and its activations
            assert np.array_equal(cap.get(f"layers.{block}", call=call), value.numpy())
        assert np.array_equal(cap.get("sum", call=call), out.detach().numpy())
    assert seen == set(outs)


def test_jax_threads_calling_one_model(tmp_path: Path) -> None:
    model = Stack(16, 4)
    fmodel = clouseau.instrument(model, select=["x", "layers.*"], path=tmp_path)
    outs: dict[tuple[int, int], np.ndarray] = {}

    def worker(t: int) -> None:
        for i in range(12):
            outs[t, i] = np.asarray(fmodel(np.full(16, (100 * t + i) / 1000, np.float32)))

    _race(worker, threads=4)
    fmodel.close()
    cap = clouseau.load(tmp_path)
    assert cap.calls == tuple(range(48)) and len(cap.graphs) == 1
    seen = set()
    for call in cap.calls:
        x = cap.get("x", call=call)
        code = round(float(x[0]) * 1000)
        seen.add((code // 100, code % 100))
        for i, value in enumerate(eager_layers(model, x)):
            assert np.allclose(cap.get(f"layers.{i}", call=call), value, rtol=1e-6, atol=1e-6)
    assert seen == set(outs)
