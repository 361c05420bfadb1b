"""``./dev.sh``: installs only when the pins or the package metadata changed.

Run against a copy of dev.sh whose ``.venv/bin/python`` and ``mkdocs`` are stand-ins that
log their arguments, so no package is installed and nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOGGER = '#!/bin/sh\necho "$(basename "$0") $*" >> "{log}"\n'


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name in ("dev.sh", "pyproject.toml", "constraints.txt"):
        shutil.copy2(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in (bin_dir / "python", bin_dir / "mkdocs", tools / "dot", tools / "chromium"):
        tool.write_text(LOGGER.format(log=tmp_path / "log"))
        tool.chmod(0o755)
    return tmp_path


def _run(repo: Path, *args: str) -> tuple[list[str], str]:
    (repo / "log").unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{repo / 'tools'}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(repo / "dev.sh"), *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    log = (repo / "log").read_text().splitlines() if (repo / "log").exists() else []
    return log, done.stdout + done.stderr


def test_bench_installs_once_then_only_when_pins_change(repo: Path) -> None:
    first, _ = _run(repo, "bench", "--quick")
    installs = [line for line in first if "pip install" in line and "-e" in line]
    assert [line.split()[-1] for line in installs] == [".[dev]", ".[dev,bench]"]
    assert first[-1] == "python -m bench --quick"
    again, output = _run(repo, "bench", "--quick")
    assert again == ["python -m bench --quick"] and "installing" not in output
    time.sleep(0.01)
    (repo / "constraints.txt").touch()  # new pins: both installs again
    changed, _ = _run(repo, "bench")
    assert sum("pip install -q -c constraints.txt -e" in line for line in changed) == 2


def test_pip_runs_with_warnings_silenced(repo: Path) -> None:
    python = repo / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$PYTHONWARNINGS $*" >> "{repo / "log"}"\n')
    log, _ = _run(repo, "bench")
    assert all(line.startswith("ignore ") for line in log if "pip" in line)


def test_docs_builds_strict_and_serves(repo: Path) -> None:
    _run(repo, "docs")  # the first call installs
    log, _ = _run(repo, "docs")
    assert log == ["mkdocs build --strict"]
    log, _ = _run(repo, "docs", "serve", "-a", "localhost:9000")
    assert log == ["mkdocs serve -a localhost:9000"]


def test_zoo_runs_the_sweep_with_its_arguments(repo: Path) -> None:
    _run(repo, "zoo")  # the first call installs
    log, _ = _run(repo, "zoo", "--only", "timm", "-k", "resnet*")
    assert log == ["python -m bench.zoo --only timm -k resnet*"]
