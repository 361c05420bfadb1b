"""Start worker processes (torchrun, plain subprocesses) with a time limit, and stop them all."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "TORCHELASTIC_ERROR_FILE": os.devnull,
    }


def run(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in a session of its own; on timeout every process of it is killed."""
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"{args} ran past {timeout}s:\n{out[-4000:]}") from None
    finally:
        if proc.poll() is None:  # only while ours: a reaped pid may be reused by anyone
            kill_tree(proc.pid)
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The parent pid is the 2nd field after the parenthesised command name.
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def kill_tree(pid: int) -> None:
    """Kill ``pid`` and every process it started, even those in sessions of their own
    (torchrun starts each worker in one)."""
    children = _children()
    tree, stack = [], [pid]
    while stack:
        current = stack.pop()
        tree.append(current)
        stack.extend(children.get(current, []))
    for member in reversed(tree):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def torchrun(script: str, *args: str, nproc: int = 2, timeout: float = 180):
    """``torchrun --standalone --nproc-per-node N script args`` (a free port of its own)."""
    return run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(ROOT / script),
            *args,
        ],
        timeout,
    )
