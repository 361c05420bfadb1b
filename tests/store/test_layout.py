"""The capture directory's layout (clouseau/store/layout.py) describes what the writers
really write: every name and marker is checked against a directory a sink wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from clouseau.ir.errors import CaptureError
from clouseau.store import DirectorySink, layout, load
from clouseau.store.files import temp_file
from tests.store.util import put_calls, small_graph, value


def _write(path: Path) -> None:
    sink = DirectorySink(path, max_size_mb=1e-6)  # one file per array: several data files
    sink.add_graph(small_graph())
    put_calls(sink, [[value("a", np.arange(10.0)), value("b", np.ones((2, 2), np.int32))]])
    sink.close()


def test_the_layout_names_every_file_a_sink_writes(tmp_path: Path) -> None:
    _write(tmp_path)
    names = sorted(os.listdir(tmp_path))
    data = [n for n in names if n.endswith(".safetensors")]
    assert data == [layout.DEFAULT_PATTERN.format(idx=i) for i in range(len(data))]
    assert len(data) == 2
    assert all(layout.is_capture_file(tmp_path / n) for n in data)
    assert layout.STATUS_FILE in names
    assert json.loads((tmp_path / layout.STATUS_FILE).read_text())["format"] == layout.FORMAT
    assert layout.graph_file(0) in names
    assert layout.graph_id(layout.graph_file(0)) == 0
    assert layout.LOCK_FILE in names
    for name in set(names) - {layout.LOCK_FILE}:
        head = (tmp_path / name).read_bytes()[: layout.HEAD_BYTES]
        assert any(marker in head for marker in layout.MARKERS), name
    assert sorted(load(tmp_path).names()) == ["a", "b"]


@pytest.mark.parametrize("name", ["x.safetensors", "graph-000.json", layout.PROBE_NAME])
def test_temporary_names_are_recognised(tmp_path: Path, name: str) -> None:
    fd, tmp = temp_file(tmp_path, name)
    os.close(fd)
    assert tmp.name.startswith(layout.temp_prefix(name))
    assert layout.is_temp_name(tmp.name)
    assert layout.is_exact_temp_name(tmp.name)
    assert not layout.is_exact_temp_name(name)


@pytest.mark.parametrize("name", ["graph-0.json", "graph-00.json", "graph-x.json", "g-000.json"])
def test_graph_id_accepts_only_the_names_the_writer_gives(name: str) -> None:
    assert layout.graph_id(name) is None
    assert layout.graph_id("graph-1234.json") == 1234


def test_is_capture_file_on_foreign_and_damaged_files(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.safetensors"
    header = json.dumps({"__metadata__": {"format": "other"}}).encode()
    foreign.write_bytes(len(header).to_bytes(8, "little") + header)
    assert not layout.is_capture_file(foreign)
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(b"\xff" * 4)
    assert not layout.is_capture_file(damaged)
    with pytest.raises(CaptureError):
        layout.is_capture_file(damaged, strict=True)
