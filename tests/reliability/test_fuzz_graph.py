"""Fuzzing the stored graph through everything that reads it (issue 15, item 12).

Each case damages ``graph-000.json`` of a real capture (a JSON value replaced anywhere in
the tree, bytes flipped or cut, structures nested deep) and runs ``load``, ``clouseau
show``, ``clouseau diff`` and ``clouseau draw`` (and ``clouseau.draw``) on it: each must
give a ClouseauError or a clean result, never another exception, never a hang.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console

import clouseau
from clouseau import cli
from clouseau.ir.errors import ClouseauError

CASES = 2000  # x 5 readers: 10,000 runs


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.act = torch.nn.GELU()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.act(self.fc(x))
        return h + x, h.sum(-1)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x, _ = block(x)
        return torch.softmax(self.head(x), -1)


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "cap"
    torch.manual_seed(0)
    # One point, so that show and diff cost little beside reading the whole graph.
    with clouseau.instrument(_Net(), select="head", path=path) as fmodel:
        fmodel(torch.randn(2, 4))
    return path


class _Hang(Exception):
    pass


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _Hang


def _readers(path: Path, other: Path, out: Path) -> list[Callable[[], object]]:
    console = Console(file=open(out / "console.txt", "w"), width=120)  # noqa: SIM115
    parser = cli._parser()

    def command(*argv: str) -> Callable[[], object]:
        args: argparse.Namespace = parser.parse_args(list(argv))

        def run() -> object:
            return args.run(args, console)

        return run

    return [
        lambda: clouseau.load(path),
        command("show", str(path), "--stats"),
        command("diff", str(path), str(other)),
        command("draw", str(path), "-o", str(out / "g.dot")),
        lambda: clouseau.draw(path, out / "h.dot", depth=1),
    ]


def _run_all(readers: list[Callable[[], object]]) -> None:
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for reader in readers:
            signal.alarm(10)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    reader()
            except ClouseauError:
                pass
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _replace(tree: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(tree))
    node = copy
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = new
    return copy


_ODD = [
    None, True, 0, -1, 1, 2**70, -(2**63), 1.5, float("nan"), "", "x", "a.b", "\x1b[2J",
    "0", "-1", [], {}, [0], [-1, 5], ["x"], [[]], {"t": []}, {"t": [1, {"t": 2}]},
    {"shape": [-3], "dtype": "float32"}, {"shape": [2], "dtype": "complex256"}, {"type": 3},
    [["a", 0]], [[99, "alias"]], [[0, "a b"]], ["n", 0], [["fc", 7]], ["f", "l", "g", "c"],
]  # fmt: skip


def _mutations(graph: dict[str, Any], rng: np.random.Generator) -> Iterator[bytes]:
    text = json.dumps(graph).encode()
    paths = list(_paths(graph))
    for _ in range(CASES):
        kind = rng.integers(6)
        if kind <= 2:  # a value anywhere replaced by an odd one
            path = paths[rng.integers(len(paths))]
            yield json.dumps(_replace(graph, path, _ODD[rng.integers(len(_ODD))])).encode()
        elif kind == 3:  # a value replaced by another value of the tree
            path = paths[rng.integers(len(paths))]
            donor = paths[rng.integers(len(paths))]
            value: Any = graph
            for step in donor:
                value = value[step]
            yield json.dumps(_replace(graph, path, value)).encode()
        elif kind == 4:  # bytes flipped
            data = bytearray(text)
            for _ in range(rng.integers(1, 4)):
                data[rng.integers(len(data))] = rng.integers(256)
            yield bytes(data)
        else:  # cut short, or nested deep
            if rng.integers(2):
                yield text[: rng.integers(len(text))]
            else:
                depth = int(rng.integers(50, 5000))
                yield (b'{"format": "clouseau.graph", "version": 1, "nodes": ' + b"[" * depth)


@pytest.mark.slow
def test_damaged_graphs_give_a_clouseau_error_or_a_clean_result(
    original: Path, tmp_path: Path
) -> None:
    graph = json.loads((original / "graph-000.json").read_text())
    cap = tmp_path / "cap"
    shutil.copytree(original, cap)
    rng = np.random.default_rng(15)
    readers = _readers(cap, original, tmp_path)
    for case, data in enumerate(_mutations(graph, rng)):
        (cap / "graph-000.json").write_bytes(data)
        try:
            _run_all(readers)
        except _Hang:
            pytest.fail(f"case {case} hangs: {data[:200]!r}")
        except Exception as err:
            raise AssertionError(
                f"case {case}: {type(err).__name__}: {err}; {data[:300]!r}"
            ) from err


def test_an_alias_out_of_range_is_one_error_naming_the_file(original: Path, tmp_path: Path) -> None:
    # show and diff raised IndexError on an alias naming an output that does not exist.
    cap = tmp_path / "cap"
    shutil.copytree(original, cap)
    graph = json.loads((cap / "graph-000.json").read_text())
    node = next(n for n in graph["nodes"] if n["kind"] == "op")
    node["aliases"] = [[7, "ghost"]]
    (cap / "graph-000.json").write_text(json.dumps(graph))
    with pytest.raises(clouseau.CaptureError, match=r"graph-000\.json is damaged .*alias 'ghost'"):
        clouseau.load(cap, strict=True)
    assert cli.main(["show", str(cap)]) == 0  # the arrays still show, the graph is listed
    assert cli.main(["diff", str(cap), str(original)]) == 0
    assert cli.main(["draw", str(cap), "-o", str(tmp_path / "g.dot")]) == 2
