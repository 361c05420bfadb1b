"""Suite-wide set-up.

torchvision from PyPI is built against CUDA torch; beside the CPU torch this project pins,
its C extension cannot load, and ``import torchvision`` then fails while registering fake
kernels for ``torchvision::nms``/``qnms`` (operators the extension would have defined).
Before anything imports torchvision, the suite defines those operators with the pure-torch
kernels of ``tests/torchvision_ops.py`` (the detection models call them once
:func:`tests.torchvision_ops.enable` ran). Where the extension loads, this does nothing.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("torch") is not None:
    from tests import torchvision_ops

    torchvision_ops.define_schemas()


# -- shared by every test directory -------------------------------------------------------
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from clouseau.ir.graph import Graph
from clouseau.ir.sink import SavedValue
from clouseau.ir.verify import verify


@dataclass
class RecordingSink:
    """A Sink that keeps everything in lists, for checking what a frontend hands over.

    ``calls[i]`` holds the ``(graph id, SavedValue)`` pairs put into call ``i``;
    ``status[i]`` is ``"begin"``, ``"end"`` or ``"fail"``. ``fail_put`` makes every put
    raise, as a full disk would. Host callbacks put from other threads: hence the lock.
    """

    graphs: list[Graph] = field(default_factory=list)
    calls: list[list[tuple[int, SavedValue]]] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    fail_put: bool = False
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_graph(self, graph: Graph) -> int:
        verify(graph)
        with self._lock:
            self.graphs.append(graph)
            return len(self.graphs) - 1

    def begin_call(self) -> int:
        with self._lock:
            assert not self.closed
            self.calls.append([])
            self.status.append("begin")
            return len(self.calls) - 1

    def put(self, call: int, graph_id: int, values: Sequence[SavedValue]) -> None:
        if self.fail_put:
            raise OSError("disk full")
        with self._lock:
            self.calls[call].extend((graph_id, v) for v in values)

    def end_call(self, call: int) -> None:
        self.status[call] = "end"

    def fail_call(self, call: int, error: BaseException) -> None:
        self.status[call] = "fail"
        self.errors.append(error)

    @property
    def ended(self) -> list[int]:
        return [i for i, s in enumerate(self.status) if s == "end"]

    @property
    def failed(self) -> list[int]:
        return [i for i, s in enumerate(self.status) if s == "fail"]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def capture(self) -> Any:
        return self.calls

    def values(self, call: int | None = None) -> dict[str, Any]:
        """name -> array of one call (by default the last call that saved anything), by
        every name of each value; iterations of a loop as name -> {index: array}."""
        if call is None:
            call = max(i for i, values in enumerate(self.calls) if values)
        out: dict[str, Any] = {}
        for _, value in self.calls[call]:
            for name in value.names:
                if value.index:
                    out.setdefault(name, {})[value.index] = value.array
                else:
                    out[name] = value.array
        return out


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    """Each test starts with TorchDynamo's caches empty. Dynamo allows 8 compilations per
    code object, and code such as ``nn.Module.__call__``'s wrapper is shared by every
    model. Past that limit, a whole suite's compilations make Dynamo run frames eagerly, so
    a later test's dynamic tier or backend sees no region (a test's result would depend on
    the tests before it)."""
    yield
    if "torch" in sys.modules:
        sys.modules["torch"].compiler.reset()


#: The pinned printed IR of hand-built and real models.
GOLDEN = Path(__file__).parent / "golden"


def check_golden(file: Path, text: str) -> None:
    """``text`` equals the golden ``file``; ``CLOUSEAU_UPDATE_GOLDEN=1`` rewrites it.

    A missing golden file fails too: a test must never write its own expectation.
    """
    if os.environ.get("CLOUSEAU_UPDATE_GOLDEN"):
        file.write_text(text)
    assert file.exists(), f"{file} is missing; create it with CLOUSEAU_UPDATE_GOLDEN=1"
    assert text == file.read_text(), (
        f"{file} changed; rerun with CLOUSEAU_UPDATE_GOLDEN=1 if intended"
    )
