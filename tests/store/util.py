"""Helpers for the store tests: a hand-built graph, saved values, and file listings."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clouseau.ir import DType, Graph, ModuleInfo, Node, NodeKind, Ref, TensorSpec
from clouseau.ir.sink import SavedValue
from clouseau.store.safetensors_io import read_array, read_header


def small_graph() -> Graph:
    """x -> fc -> relu -> output, with the relu also named by its module path."""
    x, h = TensorSpec((2, 4), DType.FLOAT32), TensorSpec((2, 3), DType.FLOAT32)
    nodes = (
        Node("x", NodeKind.INPUT, "input", outputs=(x,)),
        Node("fc", NodeKind.OP, "linear", (Ref("x"),), (h,), "fc", "Linear"),
        Node("relu", NodeKind.OP, "relu", (Ref("fc"),), (h,), "act", "ReLU", aliases=((0, "act"),)),
        Node("output", NodeKind.OUTPUT, "output", (Ref("relu"),)),
    )
    return Graph(
        nodes, name="Tiny", modules=(ModuleInfo("", "Tiny", 15), ModuleInfo("fc", "Linear", 15))
    )


def value(name: str, array: object, index: tuple[int, ...] = (), *aliases: str) -> SavedValue:
    """A saved value whose node is called ``name``."""
    return SavedValue((name, *aliases), name, array, index)


def capture_files(path: Path) -> list[Path]:
    """The complete (visible) safetensors files of a capture directory, in index order."""
    return sorted(f for f in path.glob("*.safetensors") if not f.name.startswith("."))


def temp_files(path: Path) -> list[Path]:
    return sorted(f for f in path.iterdir() if f.name.endswith(".tmp"))


def read_all(file: Path) -> dict[str, np.ndarray]:
    """Every tensor of ``file`` by key, through clouseau's own reader."""
    _, entries = read_header(file)
    return {e.key: read_array(file, e) for e in entries}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (so NaN payloads, -0.0 and bf16 bits count)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (the venv's), capturing its output."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def rss_bytes() -> int:
    """The resident set size of this process, from /proc/self/statm (no psutil needed)."""
    import os

    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def put_calls(sink: object, calls: Sequence[Sequence[SavedValue]], graph_id: int = 0) -> None:
    """Run one begin/put/end cycle per element of ``calls``."""
    for values in calls:
        call = sink.begin_call()  # type: ignore[attr-defined]
        sink.put(call, graph_id, values)  # type: ignore[attr-defined]
        sink.end_call(call)  # type: ignore[attr-defined]
