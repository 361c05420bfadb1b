"""A trace under ``vmap(axis_name=...)`` is keyed by the axis sizes, not reused across them."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest

import clouseau

RTOL, ATOL = 1e-5, 1e-6


@pytest.mark.filterwarnings("ignore:.*BatchNorm.*:UserWarning")  # Equinox's mode notice
def test_batchnorm_statistics_follow_the_batch_size() -> None:
    model, state = eqx.nn.make_with_state(eqx.nn.Sequential)(
        [eqx.nn.Linear(4, 8, key=jax.random.key(0)), eqx.nn.BatchNorm(8, axis_name="batch")]
    )

    def run(m: eqx.Module, x: jax.Array) -> tuple[jax.Array, eqx.nn.State]:
        return jax.vmap(m, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)

    fmodel = clouseau.instrument(model, select="layers.1:0", path=None)
    with fmodel:
        for batch in (4, 6, 4):
            x = jax.random.normal(jax.random.key(batch), (batch, 4))
            (want, want_state), (got, got_state) = run(model, x), run(fmodel, x)
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
            for a, b in zip(
                jax.tree_util.tree_leaves(got_state),
                jax.tree_util.tree_leaves(want_state),
                strict=True,
            ):
                np.testing.assert_allclose(
                    np.asarray(a, float), np.asarray(b, float), rtol=RTOL, atol=ATOL
                )
    captured = fmodel.captured
    assert len(captured.graphs) == 2
    for call, batch in enumerate((4, 6, 4)):
        x = jax.random.normal(jax.random.key(batch), (batch, 4))
        np.testing.assert_allclose(
            captured.get("layers.1:0", call=call), run(model, x)[0], rtol=RTOL, atol=ATOL
        )
