"""What ``explore``, ``draw`` and the inspector write and print: files created exclusively
(never through a planted link), paths' control characters escaped in every printed line,
a damaged graph and an impossible path named as such, and statistics streamed call by
call (peak memory about the largest array, measured in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import clouseau
from clouseau.cli import main
from clouseau.ir.errors import ClouseauError

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def _capture(path: Path, calls: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with clouseau.instrument(net, select="*", path=path) as fmodel, torch.no_grad():
        for _ in range(calls):
            fmodel(torch.randn(3, 4))
    return net


def _plant(directory: Path, name: str, victim: Path) -> list[Path]:
    """Links where the old writers put their files: the output and its predictable
    temporary name, both pointing at ``victim``."""
    links = [directory / name, directory / f".{name}.{os.getpid()}.tmp"]
    for link in links:
        link.symlink_to(victim)
    return links


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "bashrc"
    victim.write_text("export PS1=safe\n")
    return victim


def test_explore_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    _capture(tmp_path / "cap")
    victim = _victim(tmp_path)
    out, tmp = _plant(tmp_path, "report.html", victim)
    clouseau.explore(tmp_path / "cap", out)
    assert victim.read_text() == "export PS1=safe\n"
    assert not out.is_symlink() and "<html" in out.read_text().lower()
    assert tmp.is_symlink()  # the planted name is left alone, not opened
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and p != tmp]


def test_draw_dot_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    _capture(tmp_path / "cap")
    victim = _victim(tmp_path)
    out, _ = _plant(tmp_path, "model.dot", victim)
    clouseau.draw(tmp_path / "cap", out)
    assert victim.read_text() == "export PS1=safe\n"
    assert not out.is_symlink() and out.read_text().startswith("digraph")


def test_the_inspector_sidecar_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    from clouseau import inspector
    from clouseau.inspector._select import SIDECAR

    victim = _victim(tmp_path)
    path = tmp_path / "cap"
    path.mkdir()
    _plant(path, SIDECAR, victim)
    (path / SIDECAR).unlink()  # the sidecar itself is clouseau's; its temporary name is not
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    with inspector.tail(net, path=path) as fmodel, torch.no_grad():
        fmodel(torch.randn(3, 4))
    assert victim.read_text() == "export PS1=safe\n"
    assert json.loads((path / SIDECAR).read_text())["keys"]


def test_printed_paths_have_their_control_characters_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _capture(tmp_path / "cap")
    for command, name in (("explore", "a\x1b]0;owned\x07\x1b[2Jb.html"), ("draw", "a\x1b[2J.dot")):
        assert main([command, str(tmp_path / "cap"), "-o", str(tmp_path / name)]) == 0
        printed = capsys.readouterr().out
        assert "wrote" in printed and "\x1b" not in printed and "\\x1b" in printed
        assert (tmp_path / name).is_file()


def test_explore_on_a_damaged_graph_says_so(tmp_path: Path) -> None:
    _capture(tmp_path / "cap")
    (tmp_path / "cap" / "graph-000.json").write_text('{"nodes": [')
    damaged = pytest.raises(ClouseauError, match=r"holds a damaged graph.*graph-000\.json")
    with pytest.warns(UserWarning, match=r"graph-000\.json"), damaged as err:
        clouseau.explore(tmp_path / "cap", tmp_path / "r.html")
    assert "not written by an instrumented model" not in str(err.value)


def test_a_path_no_system_call_takes_is_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["show"], ["explore"], ["draw"]):
        assert main([*command, "a" * 300]) == 2
        err = capsys.readouterr().err
        assert "File name too long" in err and "255 bytes" in err and "Traceback" not in err
    assert main(["explore", str(tmp_path), "-o", str(tmp_path / ("b" * 300 + ".html"))]) == 2
    assert "File name too long" in capsys.readouterr().err


_WRITE = """
import sys, torch, clouseau
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
x = torch.randn(8192, 1024)  # 32 MiB per saved array, 20 of them: 640 MiB
with clouseau.instrument(net, select="*", path=sys.argv[1]) as fmodel, torch.no_grad():
    for _ in range(4):
        fmodel(x)
"""
# Measured in a process of its own, which did not write the capture (whose peak would
# hide the reader's): the peak over what the process held once the capture was loaded.
_MEASURE = """
import resource, sys, clouseau
from pathlib import Path
path = Path(sys.argv[1])
cap = clouseau.load(path)
largest = max(e.load.tensor.stop - e.load.tensor.start for e in cap.entries)  # from headers
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
{call}
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print((peak - base) / largest, len(cap.entries))
"""


def _python(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize(
    "call",
    [
        'clouseau.explore(cap, path.parent / "r.html")',
        'from clouseau.cli import main; main(["show", "--stats", str(path)])',
    ],
)
def test_explore_and_show_stream_statistics_call_by_call(tmp_path: Path, call: str) -> None:
    _python(_WRITE, str(tmp_path / "cap"))
    ratio, entries = _python(_MEASURE.replace("{call}", call), str(tmp_path / "cap")).split()[-2:]
    # About one array (and its reading) over what the process held, not the capture (20
    # arrays of 32 MiB) nor float64 copies (2x each): it was 10.7x before.
    assert entries == "20" and float(ratio) <= 2.0, ratio
