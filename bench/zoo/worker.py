"""A sweep worker: what the fork server imports once, and the case a forked worker runs.

torch, transformers and clouseau take seconds to import; every worker forked from the
server starts with them loaded. Nothing here starts a thread (a fork copies only the
thread that forks), so a worker is as fresh as a new interpreter.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # a worker changes its directory: the repository stays importable
    sys.path.insert(0, ROOT)

from bench.zoo import catalog  # noqa: E402

catalog.quiet()  # tests.conftest (torchvision's operators), one thread, notices off

import torch  # noqa: E402, F401
import transformers  # noqa: E402, F401

import clouseau  # noqa: E402, F401
from bench.zoo import check_torch, hf, vision  # noqa: E402, F401


def run(case_id: str, directory: str, cpu: float | None) -> None:
    """In a forked worker: the case, run in ``directory`` (what a model writes lands there),
    its output into worker.log, its outcome into outcome.json."""
    os.chdir(directory)
    log = os.open("worker.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    if cpu is not None:
        limit_cpu(cpu)  # a forked process starts at zero CPU seconds
    outcome = catalog.run(case_id)
    Path("outcome.json").write_text(json.dumps(outcome.to_json()))


def limit_cpu(cpu: float) -> None:
    """This process's CPU-time limit: the kernel sends SIGXCPU past it."""
    seconds = max(1, round(cpu))
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 10))
