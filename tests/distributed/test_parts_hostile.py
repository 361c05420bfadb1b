"""Loading a capture in parts (torchrun) or in blocks (Ray) whose files are damaged or
planted: each load runs in a subprocess with a timeout (a FIFO, /dev/zero or a huge
world_size must not hang it) and ends in a CaptureError naming the file, the cause and
the fix, never KeyError, TypeError or RecursionError; links are followed nowhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.test_parts import _rank

ROOT = Path(__file__).resolve().parents[2]
_LOAD = """
import sys, warnings, clouseau
warnings.simplefilter("ignore")
try:
    cap = clouseau.load(sys.argv[1])
except clouseau.CaptureError as err:
    print("CaptureError:", err)
else:
    print("loaded:", cap.missing_ranks, sorted(cap.damaged), cap.complete)
"""


def _load(path: Path, timeout: float = 60) -> str:
    """What ``clouseau.load(path)`` ends in, run in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(path)],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]  # no traceback, no signal
    return done.stdout.strip()


@pytest.fixture(scope="module")
def parted_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("parted") / "cap"
    _rank(path, 1)
    _rank(path, 0)
    return path


@pytest.fixture
def parted(parted_source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(parted_source, tmp_path / "cap", symlinks=True))


def _edit_manifest(path: Path, **fields: object) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(fields)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_the_intact_copy_loads(parted: Path) -> None:
    assert _load(parted) == "loaded: () [] True"


def test_a_fifo_as_part_json_does_not_hang(parted: Path) -> None:
    (parted / "rank-00001" / "part.json").unlink()
    os.mkfifo(parted / "rank-00001" / "part.json")
    out = _load(parted)
    assert out.startswith("CaptureError:") and "part.json is not a regular file (a FIFO)" in out


def test_part_json_linked_to_dev_zero_is_not_read(parted: Path) -> None:
    (parted / "rank-00001" / "part.json").unlink()
    (parted / "rank-00001" / "part.json").symlink_to("/dev/zero")
    out = _load(parted)
    assert "part.json is a symbolic link" in out and "remove it" in out


def test_a_huge_manifest_is_refused_without_reading_it(parted: Path) -> None:
    with open(parted / "manifest.json", "r+b") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GiB that cost no disk
    out = _load(parted, timeout=30)
    assert "manifest.json is damaged: larger than" in out


@pytest.mark.parametrize("world", [10**9, 0, -1, "2", 2.0, None, True])
def test_a_world_size_that_is_not_a_process_count(parted: Path, world: object) -> None:
    _edit_manifest(parted, world_size=world, complete=False)
    out = _load(parted, timeout=30)
    assert out.startswith("CaptureError:") and "manifest.json" in out
    assert "record again" in out or "point load() at" in out


@pytest.mark.parametrize(
    "fields",
    [
        {"parts": [1, 2]},
        {"parts": "rank-00000"},
        {"parts": [{"name": "rank-00000"}, {"name": "rank-00001"}]},
        {"parts": [{"name": 0, "rank": 0, "files": [], "calls": 0}] * 2},
        {"complete": "yes"},
        {"format": None},
    ],
)
def test_a_damaged_manifest_is_a_capture_error(parted: Path, fields: dict[str, object]) -> None:
    _edit_manifest(parted, **fields)
    out = _load(parted)
    assert out.startswith("CaptureError:") and "manifest.json" in out, out


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "[1, 2]", "{", "\xff"])
def test_damaged_json_in_a_part_is_a_capture_error(parted: Path, text: str) -> None:
    (parted / "rank-00001" / "part.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    out = _load(parted)
    assert out.startswith("CaptureError:") and "part.json is damaged" in out, out


def test_a_part_directory_that_is_a_link_is_not_followed(parted: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.move(parted / "rank-00001", elsewhere)
    (parted / "rank-00001").symlink_to(elsewhere, target_is_directory=True)
    out = _load(parted)
    assert "lists rank-00001, which is a symbolic link" in out
    _edit_manifest(parted, complete=False, parts=[])  # an unfinished run: still not followed
    out = _load(parted)
    assert out == "loaded: (1,) ['rank-00001'] False", out


_BLOCK = "block-000000000000-0123456789abcdef.safetensors"


@pytest.mark.parametrize(
    "blocks",
    [
        "all",
        [1],
        [{"part": "../../etc", "file": "passwd", "rows": [[0, 1]]}],
        [{"part": "part-0123456789ab", "file": _BLOCK, "rows": [[1]]}],
        [{"part": "part-0123456789ab", "file": _BLOCK}],
        [{"part": "part-0123456789ab", "file": _BLOCK, "rows": [[0, 4]]}],
    ],
)
def test_a_damaged_ray_block_list_is_a_capture_error(tmp_path: Path, blocks: object) -> None:
    manifest = {"format": "clouseau.blocks/1", "engine": "ray", "run": {}, "complete": True}
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "blocks": blocks}))
    (tmp_path / "part-0123456789ab").mkdir()
    out = _load(tmp_path)
    assert out.startswith("CaptureError:") and "manifest.json" in out, out
