"""Interventions on canonical names: on a value the model holds they apply, on a
computed point they are refused with the cause and the fix."""

from __future__ import annotations

import pytest
import torch

import clouseau
from tests.canonical.families import BY_NAME


def test_an_intervention_on_a_canonical_name_changes_the_model_like_a_hook() -> None:
    family = BY_NAME["llama"]
    model = family.model()
    handle = model.model.layers[0].mlp.register_forward_hook(lambda m, a, out: out * 0.0)
    with torch.no_grad():
        want = model(**family.inputs()).logits
    handle.remove()
    fmodel = clouseau.instrument(
        model,
        select="blocks.0.resid_post",
        path=None,
        intervene={"blocks.0.mlp_out": clouseau.scale(0.0)},
    )
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(fmodel(**family.inputs()).logits, want)


def test_an_intervention_on_a_computed_pattern_is_refused() -> None:
    family = BY_NAME["gpt2"]
    fmodel = clouseau.instrument(
        family.model(), select="resid_post", path=None,
        intervene={"blocks.0.attn.pattern": clouseau.scale(0.0)},
    )  # fmt: skip
    with pytest.raises(clouseau.SelectionError, match=r"computed beside the model.*eager"):
        fmodel(**family.inputs())
