"""``fmodel.generate`` against plain ``generate`` for every decoder family in tests/models.

``peers-generate`` (bench/bench_peers.py) measures GPT-2 against the peers; this suite
(``peers-generate-families``) takes every decoder-only family that
``tests/models/test_transformers.py`` tests (its ``MODELS``, so a family added there is
measured here), at a benchmark size: 4 layers of width 256 (the tests' 2x32 configs would
time Python's fixed costs only).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any

import torch

from bench.bench_torch import clear_memory
from bench.harness import Config, Variant, build, run_variants, skipped
from bench.report import Check, Report

PLAIN = "plain generate"
CLOUSEAU = "clouseau generate"
LIMIT = 1.3
# What the benchmark size changes in a tests/models config (Hugging Face's attribute_map
# turns num_hidden_layers into GPT-2's n_layer, and so on).
_SIZE = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4}
_WIDER = {"intermediate_size": 512, "num_key_value_heads": 2, "head_dim": 64}


def _families() -> dict[str, Callable[[], tuple[torch.nn.Module, Any, Any]]]:
    importlib.import_module("tests.conftest")  # torchvision's schemas, before transformers
    tests = importlib.import_module("tests.models.test_transformers")
    out = {}
    for name, factory in tests.MODELS.items():
        model = factory()[0]
        causal = type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
        if causal and not model.config.is_encoder_decoder:
            out[name] = factory
    return out


def _scaled(model: torch.nn.Module, tiny: bool) -> torch.nn.Module:
    config = copy.deepcopy(model.config)
    if not tiny:
        for key, value in _SIZE.items():
            setattr(config, key, value)
        for key, value in _WIDER.items():
            if hasattr(config, key):
                setattr(config, key, value)
    config.max_position_embeddings = max(getattr(config, "max_position_embeddings", 0), 64)
    torch.manual_seed(0)
    return type(model)(config).eval()


def _mlps(model: torch.nn.Module) -> list[str]:
    """Every decoder layer's MLP (``*.mlp``, Mixtral's ``*.block_sparse_moe`` too)."""
    ends = (".mlp", ".block_sparse_moe")
    return [n for n, _ in model.named_modules() if n.endswith(ends) and n.count(".") == 3]


def families(cfg: Config) -> Report:
    """Greedy generate of 32 tokens, every MLP output saved at every step, per family."""
    torch.set_num_threads(max(1, cfg.threads))
    torch.set_grad_enabled(False)
    new = 8 if cfg.tiny else 32
    batch = (2, 8) if cfg.tiny else (4, 16)
    report = Report(
        name="peers-generate-families",
        title=f"generate per decoder family of tests/models: {new} tokens, batch "
        f"{batch[0]}x{batch[1]}, every MLP at every step",
        description="Each family of `tests/models/test_transformers.py` that generates "
        "(decoder-only), at 4 layers x 256 (GQA with 2 key-value heads where the family has "
        "it). Before timing, clouseau's tokens equal plain generate's and it saved one value "
        "per MLP per step. `x plain` is against GPT-2's plain generate; the targets divide "
        "each family by its own.",
    )
    ids = torch.randint(2, 90, batch, generator=torch.Generator().manual_seed(0))
    kwargs = {
        "max_new_tokens": new,
        "min_new_tokens": new,
        "do_sample": False,
        "attention_mask": torch.ones_like(ids),
        "pad_token_id": 0,
    }
    variants, names = [], []
    for family, factory in _families().items():
        model = _scaled(factory()[0], cfg.tiny)
        names.append(family)
        variants.append(
            Variant(f"{family}: {PLAIN}", step=lambda m=model: m.generate(ids, **kwargs))
        )
        variants.append(
            build(f"{family}: {CLOUSEAU}", lambda m=model: _clouseau(m, ids, kwargs, new))
        )
    report.plain = variants[0].name if variants else ""
    report.results = run_variants(variants, cfg, reps=max(2, cfg.reps // 3))
    for family in names:
        report.checks.append(
            Check(
                f"generate: clouseau / plain generate, {family}",
                report.ratio(f"{family}: {CLOUSEAU}", f"{family}: {PLAIN}"),
                LIMIT,
                "<=",
            )
        )
    return report


def _clouseau(
    model: torch.nn.Module, ids: torch.Tensor, kwargs: dict[str, Any], new: int
) -> Variant:
    """``fmodel.generate`` on a copy of ``model``, checked against plain generate first."""
    import clouseau

    twin = copy.deepcopy(model)
    mlps = _mlps(twin)
    tokens = model.generate(ids, **kwargs)
    fmodel = clouseau.instrument(twin, select=mlps, path=None)
    out = fmodel.generate(ids, **kwargs)
    saved = len(fmodel.captured.records)
    clear_memory(fmodel)
    if not torch.equal(out, tokens):
        fmodel.close()
        return skipped("", "the generated tokens differ from plain generate's")
    if saved != new * len(mlps):
        fmodel.close()
        return skipped("", f"{saved} values saved, not {new * len(mlps)}")

    def step() -> Any:
        return fmodel.generate(ids, **kwargs)

    return Variant(
        "",
        step=step,
        after=lambda: clear_memory(fmodel),
        close=fmodel.close,
        note=f"{len(mlps)} MLPs",
    )
