"""clouseau's canonical names against TransformerLens' TransformerBridge on one GPT-2.

The bridge wraps a copy of the same Hugging Face model (eager attention, as the bridge
needs; no weight processing), built offline from its config; every hook point both
name must hold the same values.
"""

from __future__ import annotations

import copy

import pytest
import torch

import clouseau
from tests.canonical.families import BY_NAME, IDS

bridge_mod = pytest.importorskip("transformer_lens.model_bridge")


def _bridge(model: torch.nn.Module) -> object:
    from transformer_lens.factories.architecture_adapter_factory import (
        ArchitectureAdapterFactory,
    )
    from transformer_lens.model_bridge.sources.transformers import source

    arch = source.determine_architecture_from_hf_config(model.config)
    config = source.build_bridge_config_from_hf(model.config, arch, "gpt2", torch.float32)
    adapter = ArchitectureAdapterFactory.select_architecture_adapter(config)
    adapter.cfg.device = "cpu"
    adapter.prepare_model(model)
    return bridge_mod.TransformerBridge(model, adapter, None)


def test_every_point_both_name_equals_transformer_lens() -> None:
    model = BY_NAME["gpt2"].model("eager")
    bridge = _bridge(copy.deepcopy(model))
    with torch.no_grad():
        _, cache = bridge.run_with_cache(IDS)
    graph = clouseau.trace(model, IDS)
    shared = [name for name in graph.names() if name in cache]
    leaves = {name.rsplit(".", 1)[-1] for name in shared}
    assert {"hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_q", "hook_k",
            "hook_v", "hook_attn_scores", "hook_pattern", "hook_z", "hook_attn_out",
            "hook_pre", "hook_post", "hook_mlp_out", "hook_embed", "hook_pos_embed",
            "hook_normalized", "hook_unembed"} <= leaves, sorted(leaves)  # fmt: skip
    fmodel = clouseau.instrument(model, select=shared, path=None)
    with torch.no_grad():
        fmodel(IDS)
    for name in shared:
        got = torch.from_numpy(fmodel.captured[name])
        want = cache[name].detach()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=name)
