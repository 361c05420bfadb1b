"""``python -m bench.zoo`` (``./dev.sh zoo``): the model zoo sweep, and docs/models.md.

    python -m bench.zoo                       every case, one at a time, then the report
    python -m bench.zoo --only timm --jobs 2  one family, two workers
    python -m bench.zoo -k 'gpt*' -k 'resnet*'  the cases whose key matches a glob
    python -m bench.zoo --list                the case ids
    python -m bench.zoo --report              only rewrite docs/models.md from the results

Each case runs in a subprocess of its own with a time limit (``--timeout``, and
``--cpu-timeout`` on a loaded machine, where wall time says little); its outcome
is appended to the results file (JSON lines), and a rerun skips the cases already there
(``--retry STATUS`` reruns those with that status). See bench/zoo/__init__.py.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.zoo import catalog, report, worker
from bench.zoo.outcome import Outcome, Status, short

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results.jsonl"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results = Path(args.results)
    every = catalog.case_ids(tuple(args.only or catalog.FAMILIES))
    if args.report:
        report.write(report.load(results), Path(args.doc), _per_family(every))
        return 0
    ids = [i for i in every if _chosen(i, args.k)]
    if args.list:
        print("\n".join(ids))
        return 0
    done = {o.family + ":" + o.name: o for o in report.load(results)}
    retry = {Status(s) for s in args.retry or ()}
    pending = _breadth_first([i for i in ids if i not in done or done[i].status in retry], done)
    print(f"{len(pending)} cases to run ({len(ids) - len(pending)} already in {results})")
    _sweep(pending, results, jobs=args.jobs, timeout=args.timeout, cpu=args.cpu_timeout)
    report.write(report.load(results), Path(args.doc), _per_family(every))
    return 0


def _per_family(ids: list[str]) -> dict[str, int]:
    return {f: sum(i.startswith(f + ":") for i in ids) for f in catalog.FAMILIES}


def _breadth_first(ids: list[str], done: dict[str, Outcome]) -> list[str]:
    """``ids`` with each type's n-th case after every type's (n-1)-th, counting the done.

    A sweep stopped early then covers the most model types, not the most task classes
    of the first types in alphabetical order.
    """
    cases_of_type = Counter(_model_type(i) for i in done)
    rank = {}
    for case_id in ids:
        rank[case_id] = cases_of_type[_model_type(case_id)]
        cases_of_type[_model_type(case_id)] += 1
    return sorted(ids, key=rank.__getitem__)


def _model_type(case_id: str) -> str:
    return case_id.split("/", 1)[0]  # "transformers:gpt2/causal-lm" -> "transformers:gpt2"


def _chosen(case_id: str, patterns: list[str] | None) -> bool:
    key = case_id.split(":", 1)[1]
    return not patterns or any(fnmatch.fnmatchcase(key, p) for p in patterns)


def _sweep(ids: list[str], results: Path, *, jobs: int, timeout: float, cpu: float | None) -> None:
    from tqdm import tqdm

    lock = threading.Lock()
    bar = tqdm(total=len(ids), unit="model", dynamic_ncols=True)

    def one(case_id: str) -> None:
        outcome = run_worker(case_id, timeout, cpu=cpu)
        with lock:
            with results.open("a") as f:  # a line per model: a killed sweep keeps them
                f.write(json.dumps(outcome.to_json()) + "\n")
            bar.set_postfix_str(f"{case_id} {outcome.status.value}", refresh=False)
            bar.update()

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, ids))
    bar.close()


def run_worker(case_id: str, timeout: float, *, cpu: float | None = None) -> Outcome:
    """One case in a process of its own; a hang is TIMEOUT, a crash FAILED with its output.

    The process is forked from a server that has imported torch and transformers once
    (``bench/zoo/worker.py``): an interpreter's imports were a third of a case's time.
    ``cpu``: a limit on the worker's CPU seconds as well (its wall time grows with the
    machine's load, its CPU time does not); past it the worker is TIMEOUT too.
    """
    family, key = case_id.split(":", 1)
    with tempfile.TemporaryDirectory() as tmp:
        process = _forkserver().Process(target=worker.run, args=(case_id, tmp, cpu), daemon=True)
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            return Outcome(family, key, "", Status.TIMEOUT, detail=f"over {timeout:.0f} s")
        out = Path(tmp) / "outcome.json"
        if out.exists():
            return Outcome.from_json(json.loads(out.read_text()))
        log = (Path(tmp) / "worker.log").read_text(errors="replace")
        return exit_outcome(family, key, process.exitcode, cpu, log)


def exit_outcome(family: str, key: str, code: int | None, cpu: float | None, log: str) -> Outcome:
    """What a worker that left no outcome ran into: a limit of this machine, or a crash."""
    if cpu is not None and code == -signal.SIGXCPU:
        return Outcome(family, key, "", Status.TIMEOUT, detail=f"over {cpu:.0f} s of CPU")
    if code == -signal.SIGKILL:  # not the sweep's: it kills only past the wall-time limit
        why = "killed by the kernel: over this machine's memory (the out-of-memory killer)"
        return Outcome(family, key, "", Status.TIMEOUT, detail=why)
    tail = log.strip().splitlines()[-3:]
    return Outcome(family, key, "", Status.FAILED,
                   detail=short(f"worker exit {code}: {' '.join(tail)}"))  # fmt: skip


@functools.cache
def _forkserver() -> multiprocessing.context.ForkServerContext:
    # The server inherits this environment: one thread a worker, as the sweep has a
    # worker per core.
    os.environ.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["bench.zoo.worker"])
    return context


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--only", action="append", choices=catalog.FAMILIES, help="a family (repeatable)"
    )
    p.add_argument("-k", action="append", metavar="PATTERN", help="a glob over case keys")
    p.add_argument("--jobs", type=int, default=1, help="workers in parallel (default 1)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per model (300)")
    p.add_argument("--cpu-timeout", type=float, help="CPU seconds per model (none)")
    p.add_argument("--retry", action="append", choices=[s.value for s in Status],
                   help="rerun the cases recorded with this status")  # fmt: skip
    p.add_argument("--results", default=str(RESULTS), help="the JSON-lines results file")
    p.add_argument("--doc", default=str(ROOT / "docs" / "models.md"), help="the table written")
    p.add_argument("--list", action="store_true", help="print the case ids and exit")
    p.add_argument("--report", action="store_true", help="only rewrite the table")
    return p


if __name__ == "__main__":
    sys.exit(main())
