"""The row readers read exactly what ``load`` accepted, index as numpy does, and refuse a
file that changed after ``load`` (an error, never another run's values, never a signal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import clouseau  # noqa: E402
from clouseau.store.reader import DamagedCaptureWarning  # noqa: E402
from tests.dataset.models import seeded_mlp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _batches(n: int = 5, rows: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(rows, 8, generator=g) for _ in range(n)]


def _record(path: Path, scale: float = 1.0, **options: object) -> clouseau.Capture:
    data = [x * scale for x in _batches()]
    return clouseau.record(seeded_mlp(), data, select="fc1", path=path, progress=False, **options)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[clouseau.Capture, np.ndarray]:
    path = tmp_path_factory.mktemp("rows") / "cap"
    cap = _record(path, max_size_mb=0.0005)  # a file per call or two
    model = seeded_mlp()
    with torch.no_grad():
        eager = np.concatenate([model.fc1(x).numpy() for x in _batches()])
    return cap, eager


def _same_as_numpy(lazy: object, whole: np.ndarray, key: object) -> None:
    try:
        expected = whole[key]
    except IndexError:
        with pytest.raises(IndexError):
            lazy[key]  # type: ignore[index]
        return
    got = lazy[key]  # type: ignore[index]
    assert np.shape(got) == np.shape(expected), key
    np.testing.assert_array_equal(got, expected)


def test_lazy_array_has_numpys_indexing_semantics(recorded) -> None:
    cap, eager = recorded
    lazy = cap.array("fc1")
    whole = np.asarray(lazy)
    np.testing.assert_array_equal(whole, eager)
    n = len(whole)
    mask = np.arange(n) % 3 == 0
    keys = [
        [n], [-n - 1], [0, n], n, -n - 1, [-1, -n, 2], np.array([[0, 3], [n - 1, 5]]),
        mask, mask[:-1], np.zeros(n + 1, bool), [], np.array([1.5]), slice(None, None, -2),
        ([0, 2], [1, 3]), (mask, 2), (slice(1, 9), [0, 3]), (3, [1, 2]), (3, slice(None), None),
        (..., 0), (None, 0), np.int64(-2), np.array(4), [True] * n, ([1, 1, 0],),
    ]  # fmt: skip
    for key in keys:
        _same_as_numpy(lazy, whole, key)
    # The reported bugs: an index past the end wrapped to row 0, a mask read as indices.
    with pytest.raises(IndexError):
        lazy[[n]]
    np.testing.assert_array_equal(lazy[mask], eager[mask])


def test_row_readers_skip_the_files_load_skipped(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "cap"
    cap = _record(path)
    expected = np.asarray(cap.array("fc1"))
    key = next(iter(cap.entries)).record.key
    # A foreign file holding a clouseau key, sorted before the capture's own files, and
    # a junk file: load ignores the first and lists the second as damaged.
    save_file({key: np.full((4, 16), 7.0, np.float32)}, str(path / "a.safetensors"))
    (path / "b.safetensors").write_bytes(b"\x10" + os.urandom(64))
    with pytest.warns(DamagedCaptureWarning, match="b.safetensors"):
        again = clouseau.load(path)
    assert "b.safetensors" in again.damaged and "a.safetensors" not in again.damaged
    np.testing.assert_array_equal(np.asarray(again.array("fc1")), expected)
    batches = list(again.iter_batches("fc1", 3, shuffle=False))
    np.testing.assert_array_equal(np.concatenate(batches), expected)
    ds = again.to_torch_dataset("fc1")
    np.testing.assert_array_equal(ds[list(range(len(ds)))].numpy(), expected)


def test_a_file_replaced_after_load_is_an_error_not_its_values(tmp_path: Path) -> None:
    path, other = tmp_path / "cap", tmp_path / "other"
    cap = _record(path)
    _record(other, scale=-3.0)
    name = sorted(f.name for f in path.glob("*.safetensors"))[0]
    with pytest.raises(clouseau.CaptureError):  # another run's file, renamed into place
        os.replace(other / name, path / name)
        cap.get("fc1", call=0)
    with pytest.raises(clouseau.CaptureError, match="replaced by another file"):
        cap.array("fc1")[0]
    with pytest.raises(clouseau.CaptureError, match="load the capture again"):
        next(cap.iter_batches("fc1", 2))


_TRUNCATE = """
import os, sys, numpy as np, clouseau
from pathlib import Path
cap = clouseau.load(sys.argv[1])
lazy = cap.array("fc1")
first = lazy[0]  # the files are open now
ds = cap.to_torch_dataset("fc1")
ds[0]
for file in Path(sys.argv[1]).glob("*.safetensors"):
    os.truncate(file, 64)  # shrunk in place, under the open readers
for read in (lambda: lazy[1], lambda: next(cap.iter_batches("fc1", 2)), lambda: ds[1],
             lambda: cap.get("fc1", call=0)):
    try:
        read()
    except clouseau.CaptureError as err:
        print("refused:", "shrank" in str(err))
    else:
        print("read a truncated file")
"""


def test_a_file_truncated_under_its_map_is_an_error_not_a_signal(tmp_path: Path) -> None:
    path = tmp_path / "cap"
    _record(path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_TRUNCATE), str(path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # SIGBUS is -7
    assert done.stdout.splitlines() == ["refused: True"] * 4, done.stdout


# Reads in a loop while a thread cuts the files in half at a random moment: the cut falls
# inside a read (a copy out of a memory map was SIGBUS there, after every check passed).
_CUT_DURING_READS = """
import json, os, random, shutil, sys, threading, time
import numpy as np, clouseau
from pathlib import Path
source, work = Path(sys.argv[1]), Path(sys.argv[2])
expected = np.asarray(clouseau.load(source).array("0"))
rng = random.Random(0)
counts = {"ok": 0, "refused": 0, "wrong": 0}
def cut(files, delay):
    time.sleep(delay)
    for file in files:
        os.truncate(file, os.stat(file).st_size // 2)
for trial in range(8):
    copy = work / str(trial)
    shutil.copytree(source, copy)
    cap = clouseau.load(copy)
    lazy, ds = cap.array("0"), cap.to_torch_dataset("0")
    picked = np.sort(np.random.default_rng(trial).choice(len(expected), 300, replace=False))
    reads = [
        (lambda: lazy[:], expected),
        (lambda: lazy[picked], expected[picked]),
        (lambda: ds[picked.tolist()].numpy(), expected[picked]),
        (lambda: np.concatenate(list(cap.iter_batches("0", 256, shuffle=False))), expected),
    ]
    counts["ok" if np.array_equal(lazy[:], expected) else "wrong"] += 1  # before the cut
    cutter = threading.Thread(target=cut, args=(sorted(copy.glob("*.safetensors")),
                                                rng.uniform(0, 0.05)))
    cutter.start()
    for step in range(40):
        read, want = reads[step % len(reads)]
        try:
            got = read()
        except clouseau.CaptureError:
            counts["refused"] += 1
        else:
            counts["ok" if np.array_equal(got, want) else "wrong"] += 1
    cutter.join()
    shutil.rmtree(copy)
print(json.dumps(counts))
"""


def test_a_file_cut_during_reads_is_an_error_or_its_values_never_a_signal(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 4096)).eval()
    data = [torch.randn(256, 16) for _ in range(8)]  # 4 MiB a call, 32 MiB in all
    path = tmp_path / "cap"
    clouseau.record(model, data, select="0", path=path, progress=False)
    with torch.no_grad():
        eager = np.concatenate([model(x).numpy() for x in data])
    np.testing.assert_array_equal(np.asarray(clouseau.load(path).array("0")), eager)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CUT_DURING_READS), str(path), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # SIGBUS is -7
    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts["wrong"] == 0, counts
    assert counts["refused"] > 0 and counts["ok"] > 0, counts
