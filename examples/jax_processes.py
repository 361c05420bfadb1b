"""Capture a JAX model on an array sharded over two processes (``jax.distributed``, CPU).

    python examples/jax_processes.py /tmp/jax-run

Starts two copies of itself, each a JAX process with one CPU device, joined by
``jax.distributed.initialize`` (gloo collectives) on a free port. Each captures the
model on a global array sharded over both devices (rows split in two) and writes the
shards it holds; then this process loads the capture, whose arrays are the global ones,
and compares it with the unsharded computation.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import clouseau


def model(x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ jnp.ones((6, 6)) * 0.1)
    return h * jnp.sum(h, axis=0)


def data() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)


def worker(port: str, process_id: int, path: str) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    x = data()
    sharding = NamedSharding(jax.make_mesh((2,), ("rows",)), P("rows"))
    global_x = jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
    with clouseau.instrument(model, select="*", path=path) as fmodel:
        fmodel(global_x)  # each process writes the shards it holds
    jax.distributed.shutdown()


def main(path: str) -> None:
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = [sys.executable, __file__, "--worker", port]
    procs = [subprocess.Popen([*script, str(i), path]) for i in range(2)]
    if any(p.wait(timeout=300) for p in procs):
        sys.exit("a JAX process failed")
    cap = clouseau.load(path)
    with clouseau.instrument(model, select="*", path=None) as fmodel:
        fmodel(jnp.asarray(data()))  # one process, unsharded
        for name in cap.names():
            np.testing.assert_allclose(cap[name], fmodel.captured[name], rtol=1e-5)
    print(f"{cap}: {[(n, cap[n].shape) for n in cap.names()]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/clouseau-jax-processes")
