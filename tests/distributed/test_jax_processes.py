"""Two JAX processes (jax.distributed on CPU): a globally sharded point is written shard
by shard and loads as the global array; record splits the batches between processes."""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest

import clouseau
from tests.distributed._jax_workload import inputs, model
from tests.distributed.launch import ROOT, env, kill_tree, run

jax = pytest.importorskip("jax")

pytestmark = pytest.mark.slow
WORKER = ROOT / "tests" / "distributed" / "_jax_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(path, timeout: float = 240) -> list[str]:
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), port, str(rank), str(path)],
            cwd=ROOT,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in range(2)
    ]
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        raise AssertionError("the JAX processes ran past their time limit") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0, out[-4000:]
    return outs


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    path = tmp_path_factory.mktemp("jaxmp")
    _two_processes(path)
    return path


def _unsharded(x: np.ndarray) -> dict[str, np.ndarray]:
    with clouseau.instrument(model, select="*", path=None) as fmodel:
        fmodel(jax.numpy.asarray(x))
        return {name: np.asarray(fmodel.captured[name]) for name in fmodel.captured}


def test_a_sharded_point_loads_as_the_global_array(ran) -> None:
    cap = clouseau.load(ran / "capture")
    assert cap.world_size == 2 and cap.missing_ranks == () and cap.closed
    assert cap.calls == (0, 1)
    for call, x in enumerate(inputs()[:2]):
        expected = jax.jit(model)(x)
        reference = _unsharded(x)
        assert cap.names() == tuple(reference)
        for name, value in reference.items():
            np.testing.assert_allclose(cap.get(name, call=call), value, rtol=1e-6)
        np.testing.assert_allclose(cap.get(cap.names()[-1], call=call), expected, rtol=1e-6)
    # Each shard once: every part holds half of each sharded value, nothing twice.
    halves = [clouseau.load(ran / "capture" / f"rank-0000{r}") for r in range(2)]
    sharded = cap.names()[0]
    assert [p.get(sharded, call=0).shape for p in halves] == [(1, 4, 6), (1, 4, 6)]


def test_record_splits_the_batches_between_processes(ran) -> None:
    cap = clouseau.load(ran / "record")
    assert cap.calls == (0, 1, 2, 3) and [cap.rank(c) for c in cap.calls] == [0, 1, 0, 1]
    for call, x in enumerate(inputs()):
        for name, value in _unsharded(x).items():
            np.testing.assert_allclose(cap.get(name, call=call), value, rtol=1e-6)
    assert [(b.start, b.stop) for b in cap.batches] == [(0, 8), (8, 16), (16, 24), (24, 32)]


def test_the_launcher_example_runs_as_is(tmp_path) -> None:
    done = run([sys.executable, "examples/jax_processes.py", str(tmp_path / "run")], 300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "1 call(s) from 2 processes" in done.stdout
