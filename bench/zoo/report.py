"""docs/models.md from the sweep's results: counts against the targets, then every model."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
from collections import Counter
from pathlib import Path

from bench.zoo.outcome import Outcome, Status

# The targets: the share of the models that run eagerly that must be supported.
TARGETS = {"transformers": 0.95, "torchvision": 1.0, "timm": 0.98, "jax": 1.0}
LIBRARIES = ("torch", "transformers", "torchvision", "timm", "jax", "flax", "equinox")
ORDER = [s for s in Status]


def load(path: Path) -> list[Outcome]:
    """The results, the last line of a case winning (a retried case keeps its rerun)."""
    if not path.exists():
        return []
    found: dict[str, Outcome] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            outcome = Outcome.from_json(json.loads(line))
            found[f"{outcome.family}:{outcome.name}"] = outcome
    return list(found.values())


def write(outcomes: list[Outcome], doc: Path, cases: dict[str, int] | None = None) -> None:
    """Write the table atomically (a temporary file renamed over the old one); ``cases``:
    how many cases each family has, swept or not."""
    text = render(outcomes, cases)
    tmp = doc.with_suffix(".md.tmp")
    tmp.write_text(text)
    os.replace(tmp, doc)


def counts(outcomes: list[Outcome], family: str) -> dict[str, int]:
    c = Counter(o.status for o in outcomes if o.family == family)
    ran = sum(n for s, n in c.items() if s is not Status.NO_TINY)
    ok = c[Status.BITWISE] + c[Status.TOLERANCE]
    return {"swept": sum(c.values()), "ran": ran, "supported": ok,
            **{s.value: c[s] for s in ORDER}}  # fmt: skip


def render(outcomes: list[Outcome], cases: dict[str, int] | None = None) -> str:
    families = [f for f in TARGETS if any(o.family == f for o in outcomes)]
    lines = [
        "# Model zoo",
        "",
        "Every architecture the sweep builds from a tiny random configuration (no download),",
        'instrumented with `select="*"` and checked against the framework itself: outputs and',
        "every module output (a forward hook; JAX: the submodule called on the same input)",
        "bit for bit on PyTorch (a model's own torch.export branch: bit for bit that",
        "branch run eagerly, see *tolerance* below), within the stated tolerance on JAX; two",
        "calls at two input shapes with at most 2 traces (2 per region between graph breaks",
        "on the dynamic tier); `fmodel.generate` tokens equal to `model.generate`",
        "with every step captured. **Generated** by `./dev.sh zoo` (`python -m bench.zoo`, see",
        "[below](#how-to-run-it)); edit `bench/zoo/`, not this page.",
        "",
        f"Swept on {_date()} with {_versions()}.",
        "",
        *_coverage(outcomes, cases),
        "## Counts",
        "",
        "| family | swept | ran eagerly | supported | target | bitwise | tolerance | refused "
        "| wrong | failed | timeout | no tiny model |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for family in families:
        c = counts(outcomes, family)
        share = f"{c['supported'] / c['ran']:.0%}" if c["ran"] else "-"
        lines.append(
            f"| {family} | {c['swept']} | {c['ran']} | {c['supported']} ({share}) | "
            f"{TARGETS[family]:.0%} | {c['bitwise']} | {c['tolerance']} | {c['refused']} | "
            f"{c['wrong']} | {c['failed']} | {c['timeout']} | {c['no tiny model']} |"
        )
    lines += ["", _legend(), ""]
    lines += _problems(outcomes)
    for family in families:
        lines += ["", f"## {family}", "", "| model | task class | tier | points | traces | "
                  "generate | status | detail |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for o in sorted((o for o in outcomes if o.family == family), key=lambda o: o.name):
            lines.append(
                f"| `{o.name}` | {_cell(o.task)} | {o.tier} | {o.points or ''} | "
                f"{o.traces or ''} | {o.generate} | {o.status.value} | {_cell(o.detail)} |"
            )
    lines += ["", _how(), ""]
    return "\n".join(lines)


def _coverage(outcomes: list[Outcome], cases: dict[str, int] | None) -> list[str]:
    if not cases:
        return []
    parts = [f"{family} {sum(o.family == family for o in outcomes)} of {n}"
             for family, n in cases.items() if n]  # fmt: skip
    return [
        f"Cases swept so far: {', '.join(parts)} (a case is a model type and task class,",
        "a builder, a timm model or a JAX model); `./dev.sh zoo` resumes where it stopped.",
        "",
    ]


def _legend() -> str:
    return (
        "*supported* is bitwise plus tolerance, as a share of the models that ran eagerly "
        "(*no tiny model*: the library's own model fails to build or run from the tiny "
        "configuration, so there is nothing to compare; the detail says why). *refused*: "
        "clouseau raised an error naming the cause and the fix. *wrong*: a value differs "
        "from eager or a module output is no point, the one outcome that is never "
        "acceptable. *failed*: an unclear error, more than 2 traces (the dynamic tier: "
        "more than twice its first call's regions), or `generate` "
        "differing. *timeout*: over the per-model limit on the sweep's machine (wall "
        "time, CPU time, or its memory: the kernel killed the worker). "
        "*tolerance* on PyTorch: the model's own code computes otherwise under torch.export "
        "(`if not is_torchdynamo_exporting():`: lara_mini's and the Qwen3.5 vision-language "
        "models' delta rule solves its triangular system by forward substitution instead "
        "of `torch.linalg.solve_triangular`); torch.export sets the flag its own code reads, "
        "so no tracer avoids the branch. Every value is bitwise equal to an eager run taking "
        "that branch, and the outputs within rtol 1e-5, atol 1e-6 of eager. "
        "On the dynamic tier (`torch.dynamo`) *traces* counts the regions TorchDynamo "
        "compiled between graph breaks: torchvision's detection models break the graph at "
        "every data-dependent size (the boxes each image keeps after NMS, per level and per "
        "stage), so one call compiles tens of regions (the detail says how many) and a new "
        "shape recompiles them; every point of every region is still compared. "
        "Flax linen's module outputs have no point of their own (a linen module is no "
        "pytree; its ops are named by linen's scopes): the sweep finds each one, as "
        "`capture_intermediates` records it, among the captured values."
    )


def _problems(outcomes: list[Outcome]) -> list[str]:
    bad = [o for o in outcomes if o.status in (Status.WRONG, Status.FAILED, Status.REFUSED,
                                               Status.TIMEOUT)]  # fmt: skip
    if not bad:
        return []
    lines = ["## What does not work yet, and why", ""]
    for o in sorted(bad, key=lambda o: (ORDER.index(o.status), o.family, o.name)):
        lines.append(f"- **{o.status.value}** {o.family} `{o.name}`: {_cell(o.detail)}")
    return lines


def _how() -> str:
    return """## How to run it

```bash
./dev.sh zoo                          # every case, resumable, then this page
./dev.sh zoo --only timm --jobs 2     # one family, two workers
./dev.sh zoo -k 'gpt*' --retry failed # the keys matching a glob; rerun the failed ones
./dev.sh zoo --report                 # rewrite this page from bench/zoo/results.jsonl
```

One subprocess per model with a time limit (`--timeout`, 300 s; on a loaded machine
`--cpu-timeout` limits its CPU seconds instead of trusting wall time); outcomes are appended
to `bench/zoo/results.jsonl` and a rerun skips what is there. The CI runs a fixed sample
of these cases (`tests/zoo/`); the full sweep is this command, not a test."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _date() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")


def _versions() -> str:
    found = []
    for name in LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found.append(f"{name} {importlib.metadata.version(name)}")
    return f"Python {platform.python_version()}, " + ", ".join(found)
