"""JAX comparisons: the Equinox MLP and transformer block, plain and instrumented.

The plain forward is ``eqx.filter_jit`` of the model called on the input (``jax.jit(model)``
itself rejects an Equinox module: its array leaves are unhashable), with
``block_until_ready``. The floor of a selection is that forward, then ``jax.device_get``
and ``safetensors.numpy.save_file`` of exactly the arrays clouseau saved for it (taken
from a reference capture). An instrumented model is timed two ways: called directly
(clouseau runs its rewritten jaxpr under its own ``jit``) and inside the user's
``eqx.filter_jit`` (saves leave through a host callback; ``flush`` waits for them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np

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
from bench.models_jax import CASES, JaxCase
from bench.report import Check, Report, Table, fmt_s, fmt_x

PLAIN = "jit forward"
FLOOR_ACT = "floor: jit + device_get + save_file (act)"
FLOOR_ALL = "floor: jit + device_get + save_file (*)"
CALLBACK_FLOOR_ALL = (
    "floor in user jit: jit with a no-op debug.callback + device_get + save_file (*)"
)
NONE = "clouseau select=None"
NONE_JIT = "clouseau select=None, in user jit"
ACT_MEM = "clouseau act -> memory"
ACT_DISK = "clouseau act -> disk"
ALL_DISK = "clouseau * -> disk"
ACT_DISK_JIT = "clouseau act -> disk, in user jit"
ALL_DISK_JIT = "clouseau * -> disk, in user jit"


def _call(model: Any, *args: Any) -> Any:
    return model(*args)


def _call_with_callback(model: Any, *args: Any) -> Any:
    out = model(*args)
    jax.debug.callback(lambda *_: None, out)
    return out


def compare_model(model_name: str, cfg: Config) -> Report:
    """Every JAX variant of the issue on one Equinox model, interleaved in this process."""
    case = CASES[model_name](cfg.tiny, cfg.quick)
    act = case.act_glob
    report = Report(
        name=f"jax-{model_name}",
        title=f"JAX {model_name}: {_describe(case)}",
        description=f"`act` is `select={act!r}`; disk variants flush every call; every step "
        "ends with `block_until_ready`. *In user jit* means `eqx.filter_jit(lambda m, x: m(x))` "
        "applied to the instrumented model.",
        plain=PLAIN,
    )
    jitted = eqx.filter_jit(_call)
    with scratch_dir(cfg, f"jax-{model_name}") as d:
        # The cold first call captures select="*" once; its files are the floor's arrays.
        first = first_call_table(case, d / "first", jitted, with_warm=not cfg.quick)
        act_arrays = _captured(case, act, d / "ref-act")
        all_arrays = _loaded(d / "first" / "0")
        variants = [
            Variant(PLAIN, step=lambda: jitted(case.model, *case.inputs).block_until_ready()),
            _floor(FLOOR_ACT, case, jitted, act_arrays, d / "floor-act.safetensors"),
            _floor(FLOOR_ALL, case, jitted, all_arrays, d / "floor-all.safetensors"),
            # What JAX itself charges for any host callback inside a jitted function (an
            # effectful computation leaves the C++ dispatch fast path): the floor of any
            # tool that gets values out of the user's jit without changing its outputs.
            _floor(
                CALLBACK_FLOOR_ALL,
                case,
                eqx.filter_jit(_call_with_callback),
                all_arrays,
                d / "floor-callback.safetensors",
            ),
            build(NONE, lambda: clouseau_variant(case, None, None, jitted=None)),
            build(NONE_JIT, lambda: clouseau_variant(case, None, None, jitted=jitted)),
            build(ACT_MEM, lambda: clouseau_variant(case, act, None, jitted=None)),
            build(ACT_DISK, lambda: clouseau_variant(case, act, d / "act", jitted=None)),
            build(ALL_DISK, lambda: clouseau_variant(case, "*", d / "all", jitted=None)),
            build(ACT_DISK_JIT, lambda: clouseau_variant(case, act, d / "act-jit", jitted=jitted)),
            build(ALL_DISK_JIT, lambda: clouseau_variant(case, "*", d / "all-jit", jitted=jitted)),
        ]
        report.results = run_variants(variants, cfg)
    report.baselines = {
        ACT_DISK: FLOOR_ACT,
        ALL_DISK: FLOOR_ALL,
        ACT_DISK_JIT: FLOOR_ACT,
        ALL_DISK_JIT: CALLBACK_FLOOR_ALL,
    }
    report.tables.append(first)
    report.checks = [
        Check(
            f"jax {model_name}: select=None <= 1.03x jit forward",
            report.ratio(NONE, PLAIN),
            1.03,
            "<=",
        ),
        Check(
            f"jax {model_name}: select=None in user jit <= 1.03x jit forward",
            report.ratio(NONE_JIT, PLAIN),
            1.03,
            "<=",
        ),
        Check(
            f"jax {model_name}: select='*' to disk <= 1.2x (jit + device_get + save_file)",
            report.ratio(ALL_DISK, FLOOR_ALL),
            1.2,
            "<=",
        ),
        Check(
            f"jax {model_name}: select='*' to disk in user jit <= 1.2x (jit + device_get + save_file)",
            report.ratio(ALL_DISK_JIT, FLOOR_ALL),
            1.2,
            "<=",
        ),
    ]
    return report


def clouseau_variant(case: JaxCase, select: Any, path: Path | None, jitted: Any) -> Variant:
    """``clouseau.instrument`` of the model, called directly or inside ``jitted``."""
    import clouseau
    from bench.bench_torch import clear_memory

    fmodel = clouseau.instrument(case.model, select=select, path=path)
    if jitted is None:

        def forward() -> None:
            jax.block_until_ready(fmodel(*case.inputs))
    else:

        def forward() -> None:
            jax.block_until_ready(jitted(fmodel, *case.inputs))

    if path is None:
        return Variant("", step=forward, after=lambda: clear_memory(fmodel), close=fmodel.close)

    def step() -> None:
        forward()
        fmodel.flush()  # waits for the host callbacks, then writes: durable as in the floor

    return Variant("", step=step, after=lambda: remove_files(path), close=fmodel.close)


def _floor(
    name: str, case: JaxCase, jitted: Any, arrays: dict[str, jax.Array] | str, file: Path
) -> Variant:
    if isinstance(arrays, str):
        return skipped(name, arrays)
    from safetensors.numpy import save_file

    def step() -> None:
        jitted(case.model, *case.inputs).block_until_ready()
        save_file(jax.device_get(arrays), str(file))

    mib = sum(a.nbytes for a in arrays.values()) / 2**20
    return Variant(name, step=step, note=f"{len(arrays)} arrays, {mib:.1f} MiB")


def _to_device(array: np.ndarray) -> jax.Array:
    return jax.device_put(np.array(array))


def _captured(case: JaxCase, select: str, path: Path) -> dict[str, jax.Array] | str:
    """The arrays clouseau saves for ``select``, on the device, by file key."""
    return captured_arrays(
        case.model, case.inputs, select, path, _to_device, finish=jax.block_until_ready
    )


def _loaded(path: Path) -> dict[str, jax.Array] | str:
    return loaded_arrays(path, _to_device)


def first_call_table(case: JaxCase, d: Path, jitted: Any, with_warm: bool = True) -> Table:
    """First calls: jit compile of the plain model against clouseau's trace + rewrite + compile.

    Measured before anything else in the process touches clouseau (so *cold* includes its
    lazy imports); *warm* is a second, fresh instrument of the same model (not in --quick).
    The cold capture is left in ``d / "0"``.
    """
    plain_first = time_once(lambda: jitted(case.model, *case.inputs).block_until_ready())
    forward = min(
        time_once(lambda: jitted(case.model, *case.inputs).block_until_ready()) for _ in range(3)
    )
    cold = warm = math.nan
    status = ""
    try:
        import clouseau

        for i in range(2 if with_warm else 1):
            fmodel = clouseau.instrument(case.model, select="*", path=d / str(i))
            t = time_once(lambda fm=fmodel: jax.block_until_ready(fm(*case.inputs)))
            fmodel.close()
            cold, warm = (t, warm) if i == 0 else (cold, t)
    except Exception as err:
        status = f"failed: {type(err).__name__}: {err}"
    return Table(
        f"First call on jax {case.name}: filter_jit compile vs instrument(select='*')",
        [
            "model",
            "jit forward",
            "first jit call (compile)",
            "clouseau first call (cold)",
            "clouseau first call (warm)",
            "cold / forward",
            "note",
        ],
        [
            [
                case.name,
                fmt_s(forward),
                fmt_s(plain_first),
                fmt_s(cold),
                fmt_s(warm),
                fmt_x(cold / forward),
                status,
            ]
        ],
    )


def _describe(case: JaxCase) -> str:
    params = sum(x.size for x in jax.tree_util.tree_leaves(eqx.filter(case.model, eqx.is_array)))
    shapes = ", ".join("x".join(map(str, x.shape)) for x in case.inputs)
    return f"Equinox {type(case.model).__name__}, {params / 1e6:.1f} M parameters, input {shapes}"
