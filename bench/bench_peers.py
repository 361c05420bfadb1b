"""clouseau against its peers on one GPT-2-style model: nnsight, TransformerLens, TorchLens, hooks.

The model is a GPT-2 LM (6 layers, width 256, 4 heads, batch 8x128, eager attention, which
TransformerLens' ``TransformerBridge`` runs too) under one torch thread (``./dev.sh bench``
passes ``--threads``; the suites set it themselves when it is not given). Each workload is
one comparison in its own process, its variants interleaved; before anything is timed,
every tool's captured values are compared with forward hooks on the eager model (exactly;
the bridge recomputes attention with separate q/k/v projections, so its values are compared
to 1e-5), and a tool whose values differ is skipped with the difference. A peer that is not
installed is skipped with a line saying so. TorchLens wraps every torch function for the
rest of the process, so its workloads run in a suite of their own (``peers-torchlens``)
where the plain forward and clouseau run under the same wrappers.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import peers_tools as pt
from bench.bench_torch import clear_memory
from bench.harness import (
    Config,
    Variant,
    build,
    remove_files,
    run_variants,
    scratch_dir,
    skipped,
)
from bench.report import Check, Report

PLAIN = "plain forward"
HOOKS = "raw hooks (clone)"
NNSIGHT = "nnsight"
BRIDGE = "TL TransformerBridge"
TORCHLENS = "TorchLens"
CLOUSEAU = "clouseau"
PEERS = (HOOKS, NNSIGHT, BRIDGE, TORCHLENS)


class Case:
    """The model, its input and the reference values of the 12 module outputs."""

    def __init__(self, cfg: Config, batch: tuple[int, int] = (8, 128)) -> None:
        torch.set_num_threads(max(1, cfg.threads))
        torch.set_grad_enabled(False)
        self.layers, width = (2, 64) if cfg.tiny else (6, 256)
        if cfg.tiny:
            batch = (2, 16)
        self.model = pt.gpt2(self.layers, width)
        self.ids = torch.randint(2, 1000, batch, generator=torch.Generator().manual_seed(0))
        self.names = pt.module_names(self.layers)
        hooks = pt.Hooks(self.model, self.names)
        self.logits = self.model(self.ids).logits
        self.ref: dict[str, torch.Tensor] = dict(hooks.take())
        hooks.close()
        self.shape = f"GPT-2 {self.layers}x{width}, batch {batch[0]}x{batch[1]}"

    def run(self) -> Any:
        return self.model(self.ids)

    def twin(self) -> tuple[torch.nn.Module, Callable[[], Any]]:
        """A copy of the model (same weights) and its forward: a tool that leaves hooks or
        wrappers on its model must not tax the plain forward or another tool."""
        model = copy.deepcopy(self.model)
        return model, lambda: model(self.ids)


def verified(
    v: Variant, ref: dict[str, torch.Tensor], key: Callable[[str], str] = str, tol: float = 0.0
) -> Variant:
    """``v`` if one step's values equal ``ref`` (``key`` maps a reference name to the tool's
    name), else a skipped variant that says which value differs. Run before any timing."""
    if v.skip is not None or v.step is None:
        return v
    try:
        got = v.step()
        for name, want in ref.items():
            value = got[key(name)]
            value = value[0] if isinstance(value, tuple) else value
            value = torch.from_numpy(value.copy()) if isinstance(value, np.ndarray) else value
            if tol:
                torch.testing.assert_close(value, want, rtol=tol, atol=tol)
            elif not torch.equal(value, want):
                raise AssertionError(f"{name}: max |diff| {(value - want).abs().max().item():.3g}")
        if v.after is not None:
            v.after()
    except Exception as err:
        if v.close is not None:
            v.close()
        return skipped(v.name, f"values differ from forward hooks: {type(err).__name__}: {err}")
    return v


def clouseau_variant(
    name: str, case: Case, select: Any, path: Path | None = None, keep: bool = False
) -> Variant:
    import clouseau

    fmodel = clouseau.instrument(case.twin()[0], select=select, path=path)

    def memory_step() -> Any:
        fmodel(case.ids)
        return Lazy(lambda n: fmodel.captured[n])

    def disk_step() -> Any:
        fmodel(case.ids)
        fmodel.flush()  # durable at the end of the step, as save_file is in the floor
        return Lazy(functools.partial(_last_call, path))

    if path is None:
        return Variant(
            name, step=memory_step, after=lambda: clear_memory(fmodel), close=fmodel.close
        )
    after = None if keep else functools.partial(remove_files, path)
    return Variant(name, step=disk_step, after=after, close=fmodel.close)


class Lazy(dict):
    """A capture's values, looked up only when the check asks (the step returns it untouched)."""

    def __init__(self, get: Callable[[str], Any]) -> None:
        super().__init__()
        self.get_value = get

    def __missing__(self, name: str) -> Any:
        return self.get_value(name)


def _last_call(path: Path | None, name: str) -> Any:
    import clouseau

    cap = clouseau.load(path)
    return cap.get(name, call=max(r.call for r in cap.records))


def _ratio_check(
    report: Report, label: str, num: str, dens: tuple[str, ...], limit: float, op: str = "<="
) -> None:
    ran = [d for d in dens if (r := report.result(d)) is not None and r.ok]
    best = min(ran, key=lambda d: report.result(d).median) if ran else ""  # type: ignore[union-attr]
    ratio = report.ratio(num, best) if best else math.nan
    if op == ">=":
        ratio = report.ratio(best, num) if best else math.nan
    report.checks.append(Check(f"{label} (against {best or 'no peer'})", ratio, limit, op))


# -- 12 module outputs, and every point, in memory --------------------------------------------------
def memory(cfg: Config) -> Report:
    """12 module outputs and every point in memory: hooks, nnsight, the bridge, clouseau."""
    case = Case(cfg)
    report = Report(
        name="peers-memory",
        title=f"Peers in memory: 12 module outputs, every module, every point ({case.shape})",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        plain=PLAIN,
    )
    every = pt.execution_order(case.model, case.run)
    why_tl = pt.missing("transformer_lens")
    tl_bridge = None if why_tl else pt.bridge(case.model)
    key = pt.bridge_hook

    def bridge(name: str, hooks: Any) -> Variant:
        if tl_bridge is None:
            return skipped(name, why_tl or "")
        return verified(pt.bridge_variant(name, tl_bridge, case.ids, hooks), case.ref, key, 1e-5)

    m12, mods, mall = "12 modules: ", "every module: ", "every point: "

    def hooks(name: str, names: list[str]) -> Variant:
        model, run = case.twin()
        return verified(pt.hooks_variant(name, run, model, names), case.ref)

    def nnsight(name: str, names: list[str]) -> Variant:
        model = case.twin()[0]
        return verified(pt.nnsight_variant(name, model, (case.ids,), names), case.ref)

    # Like for like: every module output (hooks, nnsight, clouseau's hook path on the same
    # module list), and every point (every op output: clouseau's "*" against the bridge's
    # every hook point; TorchLens' every op is in peers-torchlens).
    variants = [
        Variant(PLAIN, step=case.run),
        hooks(m12 + HOOKS, case.names),
        nnsight(m12 + NNSIGHT, case.names),
        bridge(m12 + BRIDGE, [key(n) for n in case.names]),
        verified(build(m12 + CLOUSEAU, lambda: clouseau_variant("", case, case.names)), case.ref),
        hooks(mods + HOOKS, every),
        nnsight(mods + NNSIGHT, every),
        verified(build(mods + CLOUSEAU, lambda: clouseau_variant("", case, every)), case.ref),
        bridge(mall + BRIDGE, None),
        verified(build(mall + CLOUSEAU, lambda: clouseau_variant("", case, "*")), case.ref),
    ]
    for v in variants[5:8]:
        v.note = f"every module ({len(every)})"
    variants[8].note = "every hook point"
    variants[9].note = "every point of the graph (op outputs)"
    report.results = run_variants(variants, cfg)
    for prefix in (m12, mods, mall):
        _ratio_check(
            report,
            f"{prefix}clouseau / best peer",
            prefix + CLOUSEAU,
            tuple(prefix + p for p in PEERS),
            1.0,
        )
    return report


# -- to disk, in both page-cache states ------------------------------------------------------------
def disk(cfg: Config) -> Report:
    """12 module outputs and every point to disk against hooks/forward + save_file."""
    from safetensors.torch import save_file

    case = Case(cfg)
    report = Report(
        name="peers-disk",
        title=f"To disk: 12 module outputs and every point, against the floor ({case.shape})",
        description="The floor of the 12 outputs is forward hooks that clone + "
        "`safetensors.torch.save_file`; the floor of every point is the plain forward + "
        "`save_file` of exactly the tensors clouseau writes for `'*'` (from a reference "
        "capture). *removed*: the files are deleted after every sample, so the kernel frees "
        "their pages; *kept*: every sample's files stay until the end, so dirty pages pile "
        "up and write-back runs under the writes. Every step ends with its data written "
        "(`fmodel.flush()`). Each floor and its clouseau run as a pair of their own, "
        "alternating which goes first, so that neither always pays for the other's dirty "
        "pages. The floors match clouseau's files: the same bytes, one file per call, no "
        "fsync; their writes (one per tensor, up to 4 MiB here) and clouseau's (1 MiB) cost "
        "the same system time on this disk (docs/performance.md).",
        plain=PLAIN,
    )
    counter = iter(range(10**9))
    with scratch_dir(cfg, "peers-disk") as d:
        everything = _all_tensors(case, d / "ref")

        def floor(name: str, tensors: Callable[[], dict[str, torch.Tensor]], keep: bool) -> Variant:
            out = d / ("floor-kept" if keep else "floor")
            out.mkdir(parents=True, exist_ok=True)

            def step() -> Any:
                saved = tensors()
                save_file(saved, str(out / f"{next(counter) if keep else 0}.safetensors"))
                return saved

            return Variant(
                name, step=step, after=None if keep else functools.partial(remove_files, out)
            )

        hooked, run_hooked = case.twin()
        hooks = pt.Hooks(hooked, case.names)

        def twelve() -> dict[str, torch.Tensor]:
            run_hooked()
            return dict(hooks.take())

        def all_points() -> dict[str, torch.Tensor]:
            case.run()
            return everything  # type: ignore[return-value]

        # Each floor and its clouseau run as a pair of their own, alternating (floor first
        # in one repetition, clouseau first in the next): in one list of all variants
        # interleaved in a fixed cycle, clouseau always ran right after its floor had left
        # hundreds of MiB of dirty pages, and paid for their write-back.
        results = run_variants([Variant(PLAIN, step=case.run)], cfg)
        reps = cfg.reps + cfg.reps % 2  # even: each one first as often as the other
        for keep in (False, True):
            state = " (kept)" if keep else " (removed)"
            pairs = [
                (
                    floor("12 modules: floor" + state, twelve, keep),
                    verified(
                        build(
                            "12 modules: clouseau" + state,
                            lambda k=keep: clouseau_variant("", case, case.names, d / f"c12{k}", k),
                        ),
                        case.ref,
                    ),
                )
            ]
            if isinstance(everything, str):
                pairs.append(
                    (
                        skipped("every point: floor" + state, everything),
                        skipped("every point: clouseau" + state, everything),
                    )
                )
            else:
                pairs.append(
                    (
                        floor("every point: floor" + state, all_points, keep),
                        verified(
                            build(
                                "every point: clouseau" + state,
                                lambda k=keep: clouseau_variant("", case, "*", d / f"call{k}", k),
                            ),
                            case.ref,
                        ),
                    )
                )
            for pair in pairs:
                results += run_variants(list(pair), cfg, reps=reps)
        report.results = results
        hooks.close()
    for what in ("12 modules", "every point"):
        for state in (" (removed)", " (kept)"):
            report.baselines[f"{what}: clouseau{state}"] = f"{what}: floor{state}"
            report.checks.append(
                Check(
                    f"{what} to disk{state}: clouseau / floor",
                    report.ratio(f"{what}: clouseau{state}", f"{what}: floor{state}"),
                    1.1,
                    "<=",
                )
            )
    return report


def _all_tensors(case: Case, path: Path) -> dict[str, torch.Tensor] | str:
    from bench.harness import captured_arrays

    got = captured_arrays(case.model, (case.ids,), "*", path, lambda a: torch.from_numpy(a.copy()))
    return got


# -- greedy generation ---------------------------------------------------------------------------
def generate(cfg: Config) -> Report:
    """Greedy generate of 32 tokens, every MLP saved at every step."""
    case = Case(cfg, batch=(8, 16))
    new = 8 if cfg.tiny else 32
    mlps = [n for n in case.names if n.endswith(".mlp")]
    mask = torch.ones_like(case.ids)
    kwargs = {
        "max_new_tokens": new,
        "min_new_tokens": new,
        "do_sample": False,
        "attention_mask": mask,
    }
    report = Report(
        name="peers-generate",
        title=f"Greedy generate of {new} tokens, every MLP at every step ({case.shape})",
        description="`model.generate` with every MLP output saved at every forward step "
        "(prefill and decode), kept in memory. Before timing, every tool's tokens equal plain "
        "generate's, and it saved one value per MLP per step.",
        plain="plain generate",
    )
    tokens = case.model.generate(case.ids, **kwargs)
    expected = new * len(mlps)

    def checked(name: str, factory: Callable[[], Variant], exact: bool = True) -> Variant:
        v = build(name, factory)
        if v.skip is not None or v.step is None:
            return v
        try:
            out, saved = v.step()
            out = torch.as_tensor(out)
            if out.shape != tokens.shape or (exact and not torch.equal(out, tokens)):
                raise AssertionError("the generated tokens differ from plain generate's")
            if not exact:
                # Its attention differs by 1e-7: a near-tie of a random model's logits
                # can flip a greedy token, the work per step is the same.
                same = (out == tokens).float().mean().item()
                v.note = f"{same:.0%} of the tokens equal plain generate's"
            if saved != expected:
                raise AssertionError(f"{saved} values saved, not {expected}")
            if v.after is not None:
                v.after()
        except Exception as err:
            if v.close is not None:
                v.close()
            return skipped(name, f"{type(err).__name__}: {err}")
        return v

    variants = [
        Variant("plain generate", step=lambda: case.model.generate(case.ids, **kwargs)),
        checked(HOOKS, lambda: _hooks_generate(case, mlps, kwargs)),
        checked(NNSIGHT, lambda: _nnsight_generate(case, mlps, kwargs)),
        checked(BRIDGE, lambda: _bridge_generate(case, mlps, new), exact=False),
        checked(CLOUSEAU, lambda: _clouseau_generate(case, mlps, kwargs)),
    ]
    report.results = run_variants(variants, cfg, reps=max(2, cfg.reps // 3))
    _ratio_check(report, "generate: clouseau / best peer", CLOUSEAU, PEERS, 1.0)
    report.checks.append(
        Check(
            "generate: clouseau / plain generate",
            report.ratio(CLOUSEAU, "plain generate"),
            1.3,
            "<=",
        )
    )
    return report


def _hooks_generate(case: Case, mlps: list[str], kwargs: dict[str, Any]) -> Variant:
    model = case.twin()[0]
    hooks = pt.Hooks(model, mlps)

    def step() -> tuple[Any, int]:
        out = model.generate(case.ids, **kwargs)
        return out, len(hooks.take())

    return Variant("", step=step, close=hooks.close, note="registered once")


def _nnsight_generate(case: Case, mlps: list[str], kwargs: dict[str, Any]) -> Variant:
    why = pt.missing("nnsight")
    if why:
        return skipped("", why)
    import nnsight

    wrapped = pt.nnsight_language_model(case.twin()[0])
    envoys = [functools.reduce(pt._envoy, n.split("."), wrapped) for n in mlps]
    steps = kwargs["max_new_tokens"]  # min_new_tokens too: every step runs

    def step() -> tuple[Any, int]:
        with wrapped.generate(case.ids, **kwargs) as tracer:
            saved = nnsight.save([])
            # A bounded loop (an open one ends the block at its end, skipping what follows).
            for _ in tracer.iter[:steps]:
                for envoy in envoys:
                    saved.append(envoy.output)
            out = tracer.result.save()
        return out, len(saved)

    return Variant("", step=step, note="TransformersModel over the built model")


def _bridge_generate(case: Case, mlps: list[str], new: int) -> Variant:
    why = pt.missing("transformer_lens")
    if why:
        return skipped("", why)
    tl_bridge = pt.bridge(case.model)
    saved: list[Any] = []
    hooks = [(pt.bridge_hook(n), lambda t, hook: saved.append(t.detach().clone())) for n in mlps]

    def step() -> tuple[Any, int]:
        saved.clear()
        with tl_bridge.hooks(fwd_hooks=hooks):
            out = tl_bridge.generate(
                case.ids,
                max_new_tokens=new,
                do_sample=False,
                stop_at_eos=False,
                verbose=False,
                attention_mask=torch.ones_like(case.ids),
            )
        return out, len(saved)

    return Variant("", step=step)


def _clouseau_generate(case: Case, mlps: list[str], kwargs: dict[str, Any]) -> Variant:
    import clouseau

    fmodel = clouseau.instrument(case.twin()[0], select=mlps, path=None)

    def step() -> tuple[Any, int]:
        out = fmodel.generate(case.ids, **kwargs)
        return out, len(fmodel.captured.records)

    return Variant("", step=step, after=lambda: clear_memory(fmodel), close=fmodel.close)


# -- the plot of every peers suite ------------------------------------------------------------
PLOT = Path(__file__).resolve().parent / "peers.png"


def plot(reports: list[Report], path: Path = PLOT) -> str:
    """Draw each tool's time / the plain run, per workload, into ``path``; say what was done.

    matplotlib comes with the bench extra (``./dev.sh bench`` installs it); without it nothing
    is drawn and the line returned says so.
    """
    bars: dict[str, dict[str, float]] = {}  # workload -> tool -> ratio to plain
    for report in reports:
        if not report.name.startswith("peers-") or not report.plain:
            continue
        plain_tool = report.plain.rpartition(": ")[2]
        for r in report.results:
            workload, _, tool = r.name.rpartition(": ")
            # A workload with a plain run of its own (a decoder family) is divided by it.
            own = f"{workload}: {plain_tool}"
            den = own if workload and report.result(own) is not None else report.plain
            if r.ok and r.name != den and "floor" not in r.name:
                label = f"{report.name.removeprefix('peers-')} {workload}".strip()
                bars.setdefault(label, {})[tool] = report.ratio(r.name, den)
    if not bars:
        return "bench/peers.png: not drawn (no peers-* comparison ran)"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "bench/peers.png: not drawn: matplotlib is not installed (`pip install matplotlib`)"
    tools = sorted({t for row in bars.values() for t in row})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(bars)), 4))
    width = 0.8 / len(tools)
    for k, tool in enumerate(tools):
        xs = [i + k * width for i, row in enumerate(bars.values()) if tool in row]
        ys = [row[tool] for row in bars.values() if tool in row]
        ax.bar(xs, ys, width, label=tool)
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(bars))], list(bars), rotation=20, ha="right"
    )
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("time / plain run (log)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path.name}"
