"""One of two JAX processes (``jax.distributed``, CPU, gloo collectives).

Arguments: ``PORT PROCESS_ID PATH``. Captures ``_jax_workload.model`` on an array sharded over
both processes' devices into ``PATH/capture``, and records each process's share of the
batches into ``PATH/record``.
"""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{sys.argv[1]}", num_processes=2, process_id=int(sys.argv[2]))

from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import clouseau  # noqa: E402
from tests.distributed._jax_workload import inputs, model  # noqa: E402


def main(path: str) -> None:
    mesh = jax.make_mesh((2,), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    with clouseau.instrument(model, select="*", path=f"{path}/capture") as fmodel:
        for x in inputs()[:2]:
            global_x = jax.make_array_from_callback(x.shape, sharding, lambda i, x=x: x[i])
            out = fmodel(global_x)
            assert not out.is_fully_addressable  # the values are truly sharded
    rank = jax.process_index()
    # record: each process its share of the batches (local arrays), as under torchrun.
    clouseau.record(model, inputs()[rank::2], select="*", path=f"{path}/record", progress=False)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[3])
