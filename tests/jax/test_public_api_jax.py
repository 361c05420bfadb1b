"""The JAX frontend through the public API: in-memory captures and capture directories."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import clouseau
from tests.jax.models import MLP, mlp_reference, scan_mlp, scan_params, scan_reference

KEY = jax.random.PRNGKey(0)


def test_instrument_in_memory_and_directory(tmp_path: Path) -> None:
    model = MLP((4, 8, 8, 3), key=KEY)
    xs = jax.random.normal(KEY, (3, 4))
    with clouseau.instrument(model, select="relu*", path=None) as fm:
        jax.vmap(fm)(xs)
        captured = fm.captured
    np.testing.assert_allclose(
        captured["relu"],
        jax.vmap(lambda x: mlp_reference(model, x)["relu"])(xs),
        rtol=1e-5,
        atol=1e-6,
    )
    with clouseau.instrument(model, select="layers.?", path=tmp_path / "cap") as fm:
        fm(xs[0])
        jax.jit(lambda x: fm(x))(xs[1])
    cap = clouseau.load(tmp_path / "cap")
    for call, x in enumerate(xs[:2]):
        np.testing.assert_allclose(
            cap.get("layers.1", call=call),
            mlp_reference(model, x)["layers.1"],
            rtol=1e-5,
            atol=1e-6,
        )
    assert cap.graph is not None and "layers.1" in cap.graph.names()


def test_trace_dispatches_to_jax() -> None:
    graph = clouseau.trace(scan_mlp, scan_params(KEY), jnp.zeros(6))
    assert "scan.tanh" in graph.names()


def test_scan_iterations_are_saved_with_their_index(tmp_path: Path) -> None:
    params = scan_params(KEY)
    x = jnp.linspace(-1, 1, 6)
    with clouseau.instrument(scan_mlp, select="scan.tanh", path=tmp_path) as fm:
        fm(params, x)
    cap = clouseau.load(tmp_path)
    ref = scan_reference(params, x)["scan.tanh"]
    got = np.asarray(cap["scan.tanh"])  # the iterations, stacked by the store
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-5, atol=1e-6)
