"""PyTorch comparisons: one per model, plus TorchLens in a process of its own.

Every disk variant makes each call durable before the step ends (``fmodel.flush()`` after
the call, ``save_file`` in the baselines), so all of them do the same work per step: one
forward and one safetensors file of the same tensors. The *floor* of a selection is the
plain forward followed by ``safetensors.torch.save_file`` of exactly the arrays clouseau
saved for it (taken from a reference capture): what no capture tool can beat.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.harness import (
    Config,
    Variant,
    build,
    captured_arrays,
    loaded_arrays,
    remove_files,
    run_variants,
    scratch_dir,
    skipped,
    time_once,
)
from bench.models_torch import CASES, TorchCase
from bench.report import Check, Report, Table, fmt_s, fmt_x

PLAIN = "plain forward"
FLOOR_ACT = "floor: forward + save_file (act)"
FLOOR_ALL = "floor: forward + save_file (*)"
NONE = "clouseau select=None"
ACT_MEM = "clouseau act -> memory"
ACT_DISK = "clouseau act -> disk"
ALL_DISK = "clouseau * -> disk"
HOOKS_ACT = "hooks recipe (act modules)"
HOOKS_ALL = "hooks recipe (all modules)"
TL_ALL = "TorchLens save-all"
TL_ACT = "TorchLens act selector"

TORCHLENS_PIN = "torchlens==2.36.1"


def compare_model(model_name: str, cfg: Config) -> Report:
    """Every variant of the issue on one torch model, interleaved in this process."""
    torch.set_grad_enabled(False)  # inference: all variants alike
    case = CASES[model_name](cfg.tiny, cfg.quick)
    act = case.act_glob
    report = Report(
        name=f"torch-{model_name}",
        title=f"PyTorch {model_name}: {_describe(case)}",
        description=f"`act` is `select={act!r}`; disk variants flush every call.",
        plain=PLAIN,
    )
    with scratch_dir(cfg, model_name) as d:
        # The cold first call captures select="*" once; its files are the floor's tensors.
        first = first_call_table(case, d / "first", with_warm=not cfg.quick)
        act_tensors = _captured(case, act, d / "ref-act")
        all_tensors = _loaded(d / "first" / "0")
        variants = [
            Variant(PLAIN, step=lambda: case.model(*case.inputs)),
            _floor(FLOOR_ACT, case, act_tensors, d / "floor-act.safetensors"),
            _floor(FLOOR_ALL, case, all_tensors, d / "floor-all.safetensors"),
            build(NONE, lambda: clouseau_variant(case, None, None)),
            build(ACT_MEM, lambda: clouseau_variant(case, act, None)),
            build(ACT_DISK, lambda: clouseau_variant(case, act, d / "act")),
            build(ALL_DISK, lambda: clouseau_variant(case, "*", d / "all")),
            hooks_variant(
                HOOKS_ACT,
                case,
                _is_activation_module,
                d / "hooks-act.safetensors",
                "ReLU/GELU modules",
            ),
            hooks_variant(
                HOOKS_ALL, case, lambda m: True, d / "hooks-all.safetensors", "every module"
            ),
        ]
        report.results = run_variants(variants, cfg)
    report.baselines = {ACT_DISK: FLOOR_ACT, ALL_DISK: FLOOR_ALL, HOOKS_ACT: FLOOR_ACT}
    report.tables.append(first.table)
    report.checks = [
        Check(
            f"{model_name}: select=None <= 1.03x plain forward",
            report.ratio(NONE, PLAIN),
            1.03,
            "<=",
        ),
        Check(
            f"{model_name}: select='*' to disk <= 1.15x (forward + save_file of the same tensors)",
            report.ratio(ALL_DISK, FLOOR_ALL),
            1.15,
            "<=",
        ),
    ]
    if model_name == "cnn":
        report.checks.append(
            Check(
                "cnn: first call of instrument (trace + rewrite + compile) < 2 s",
                first.cold,
                2.0,
                "<",
                "s",
            )
        )
    return report


def compare_torchlens(model_name: str, cfg: Config) -> Report:
    """clouseau against TorchLens on one model, in a process of its own.

    TorchLens wraps every torch function on its first call and leaves the wrappers in
    place, which taxes every later forward in the process; the main comparison therefore
    never imports it, and here every variant runs under the same wrappers.
    """
    torch.set_grad_enabled(False)
    case = CASES[model_name](cfg.tiny, cfg.quick)
    report = Report(
        name=f"torchlens-{model_name}",
        title=f"PyTorch {model_name} against TorchLens",
        description="TorchLens keeps its activations in memory; clouseau writes them to disk "
        "and flushes every call.",
        plain=PLAIN,
    )
    try:
        import torchlens as tl
    except ImportError as err:
        report.error = f"TorchLens is not installed ({err}); `pip install {TORCHLENS_PIN}` adds this comparison"
        return report
    with scratch_dir(cfg, f"tl-{model_name}") as d:
        variants = [
            Variant(PLAIN, step=lambda: case.model(*case.inputs)),
            build(ALL_DISK, lambda: clouseau_variant(case, "*", d / "all")),
            build(ACT_DISK, lambda: clouseau_variant(case, case.act_glob, d / "act")),
            build(TL_ALL, lambda: Variant(TL_ALL, step=lambda: tl.trace(case.model, *case.inputs))),
            build(
                TL_ACT,
                lambda: Variant(
                    TL_ACT,
                    step=lambda: tl.trace(case.model, *case.inputs, save=tl.func(case.act_func)),
                ),
            ),
        ]
        # TorchLens takes seconds a call on the CNN: fewer repetitions keep the run short.
        report.results = run_variants(variants, cfg, reps=min(cfg.reps, 2 if cfg.quick else 5))
    report.baselines = {TL_ALL: ALL_DISK, TL_ACT: ACT_DISK}
    need = {"mlp": 10.0, "cnn": 3.0}.get(model_name)
    if need is not None:
        report.checks.append(
            Check(
                f"{model_name}: clouseau '*' to disk >= {need:g}x faster than TorchLens save-all",
                report.ratio(TL_ALL, ALL_DISK),
                need,
                ">=",
            )
        )
    return report


# -- variants ---------------------------------------------------------------------------------
def clouseau_variant(
    case: TorchCase, select: Any, path: Path | None, max_size_mb: float = 1024
) -> Variant:
    """``clouseau.instrument`` of the model; the first call (the trace) happens in warm-up."""
    import clouseau

    fmodel = clouseau.instrument(case.model, select=select, path=path, max_size_mb=max_size_mb)
    if path is None:
        return Variant(
            "",
            step=lambda: fmodel(*case.inputs),
            after=lambda: clear_memory(fmodel),
            close=fmodel.close,
        )

    def step() -> None:
        fmodel(*case.inputs)
        fmodel.flush()  # durable at the end of the step, as save_file is in the floor

    return Variant("", step=step, after=lambda: remove_files(path), close=fmodel.close)


def clear_memory(fmodel: Any) -> None:
    """Drop what an in-memory capture holds, so samples do not pile up in RAM.

    It reaches into the MemorySink (no public API drops a capture's contents); if that
    attribute changes, the capture merely accumulates, which the sizes here allow.
    """
    sink = getattr(fmodel, "_sink", None)
    for held in ("_items", "_pending"):  # records built, and puts not read yet
        items = getattr(sink, held, None)
        if isinstance(items, list):
            items.clear()


def _floor(
    name: str, case: TorchCase, tensors: dict[str, torch.Tensor] | str, file: Path
) -> Variant:
    if isinstance(tensors, str):
        return skipped(name, tensors)
    from safetensors.torch import save_file

    def step() -> None:
        case.model(*case.inputs)
        save_file(tensors, str(file))

    return Variant(name, step=step, note=f"{len(tensors)} tensors, {_mib(tensors):.1f} MiB")


def hooks_variant(
    name: str, case: TorchCase, want: Callable[[nn.Module], bool], file: Path, note: str
) -> Variant:
    """The original clouseau recipe: forward hooks that detach and copy, then save_file.

    Hooks are registered before the forward and removed after it, as the original
    ``tail`` did; a module called twice (ResNet's shared ReLU) gets ``name#1``, ``#2``...
    """
    from safetensors.torch import save_file

    modules = [(n or "root", m) for n, m in case.model.named_modules() if want(m)]

    def step() -> None:
        saved: dict[str, torch.Tensor] = {}

        def hook_for(module_name: str) -> Callable[..., None]:
            def hook(_m: nn.Module, _inp: Any, out: Any) -> None:
                if isinstance(out, torch.Tensor):
                    key = module_name
                    k = 1
                    while key in saved:
                        key, k = f"{module_name}#{k}", k + 1
                    saved[key] = out.detach().clone()

            return hook

        handles = [m.register_forward_hook(hook_for(n)) for n, m in modules]
        try:
            case.model(*case.inputs)
        finally:
            for h in handles:
                h.remove()
        save_file(saved, str(file))

    return Variant(name, step=step, note=f"{note} ({len(modules)})")


def _is_activation_module(m: nn.Module) -> bool:
    return isinstance(m, nn.ReLU | nn.GELU)


# -- the tensors we save -----------------------------------------------------------------------
def _to_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array.copy())


def _captured(case: TorchCase, select: str, path: Path) -> dict[str, torch.Tensor] | str:
    """The arrays clouseau saves for ``select``, as torch tensors by file key."""
    return captured_arrays(case.model, case.inputs, select, path, _to_tensor)


def _loaded(path: Path) -> dict[str, torch.Tensor] | str:
    return loaded_arrays(path, _to_tensor)


def _mib(tensors: dict[str, torch.Tensor]) -> float:
    return sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20


# -- first call ---------------------------------------------------------------------------------
class FirstCall:
    """The first-call costs of one model, and the table that shows them."""

    def __init__(self, cold: float, warm: float, forward: float, table: Table) -> None:
        self.cold, self.warm, self.forward, self.table = cold, warm, forward, table


def first_call_table(case: TorchCase, d: Path, with_warm: bool = True) -> FirstCall:
    """Time the first call of ``instrument(select='*')``: trace + rewrite + compile + forward.

    *cold* is the first instrument in this process (it also pays clouseau's lazy imports
    of torch.fx machinery), *warm* a second, fresh instrument of the same model (not in
    --quick); *cold - forward* is the one-time cost beyond the call itself. Measured before
    anything else in the process touches clouseau. The cold capture is left in ``d / "0"``.
    """
    forward = min(time_once(lambda: case.model(*case.inputs)) for _ in range(3))
    cold = warm = math.nan
    status = ""
    try:
        import clouseau

        for i in range(2 if with_warm else 1):
            fmodel = clouseau.instrument(case.model, select="*", path=d / str(i))
            t = time_once(lambda fm=fmodel: fm(*case.inputs))
            fmodel.close()
            cold, warm = (t, warm) if i == 0 else (cold, t)
    except Exception as err:
        status = f"failed: {type(err).__name__}: {err}"
    rows = [
        [
            case.name,
            fmt_s(forward),
            fmt_s(cold),
            fmt_s(warm),
            fmt_s(cold - forward),
            fmt_x(cold / forward),
            fmt_x(warm / forward),
            status,
        ]
    ]
    table = Table(
        f"First call of instrument(select='*') on {case.name}",
        [
            "model",
            "plain forward",
            "first call (cold)",
            "first call (warm)",
            "cold - forward",
            "cold / forward",
            "warm / forward",
            "note",
        ],
        rows,
    )
    return FirstCall(cold, warm, forward, table)


def _describe(case: TorchCase) -> str:
    params = sum(p.numel() for p in case.model.parameters())
    return f"{type(case.model).__name__}, {params / 1e6:.1f} M parameters, input {_shapes(case)}"


def _shapes(case: TorchCase) -> str:
    return ", ".join("x".join(map(str, t.shape)) for t in case.inputs)
