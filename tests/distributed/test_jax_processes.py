"""Multi-process JAX is detected and refused with a clear error (not built yet)."""

from __future__ import annotations

import socket
import sys
import textwrap

import pytest

from tests.distributed.launch import run

pytest.importorskip("jax")

SCRIPT = textwrap.dedent(
    """
    import sys
    import jax
    import jax.numpy as jnp
    import clouseau

    jax.distributed.initialize(f"127.0.0.1:{sys.argv[1]}", num_processes=1, process_id=0)
    f = lambda x: jnp.tanh(x) * 2
    try:
        clouseau.instrument(f, select="*", path=sys.argv[2])
    except clouseau.CaptureError as err:
        print("refused:", err)
    with clouseau.instrument(f, select="tanh", path=None) as fmodel:  # in memory: fine
        x = jnp.arange(4.0)
        fmodel(x)
        assert (fmodel.captured["tanh"] == jax.jit(jnp.tanh)(x)).all()
    print("in memory: ok")
    jax.distributed.shutdown()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_capture_path_under_jax_distributed_is_refused(tmp_path) -> None:
    done = run([sys.executable, "-c", SCRIPT, str(_free_port()), str(tmp_path / "run")], 120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "refused: clouseau cannot write a capture from several JAX processes" in done.stdout
    assert "in memory: ok" in done.stdout
    assert not (tmp_path / "run").exists()
