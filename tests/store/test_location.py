"""The location layer on a local directory: what an earlier capture may lose (the files it
lists, by name), and messages that print a path escaped (issue 26, items 4 and 9)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clouseau.ir.errors import CaptureError
from clouseau.store.directory_sink import DirectorySink
from clouseau.store.reader import load
from tests.store.util import put_calls, small_graph, value


def _capture(path: Path, calls: int) -> None:
    sink = DirectorySink(path, max_size_mb=0.0001)
    sink.add_graph(small_graph())
    put_calls(sink, [[value("relu", np.full(64, float(k)))] for k in range(calls)])
    sink.close()


def test_a_second_writer_is_refused_with_the_path_escaped(tmp_path: Path) -> None:
    path = tmp_path / "run\x1b[2J\nforged"
    first = DirectorySink(path)
    try:
        with pytest.raises(CaptureError) as caught:
            DirectorySink(path)
        message = str(caught.value)
        assert "\x1b" not in message and "\n" not in message
        assert "run\\x1b[2J\\nforged" in message
    finally:
        first.close()


def test_files_renamed_after_the_last_status_are_the_earlier_captures_own(tmp_path: Path) -> None:
    # A writer killed between a file's rename and the next status: the status lists fewer
    # files than there are; the next names of its own pattern are still its own.
    _capture(tmp_path, 4)

    status_file = tmp_path / "status.json"
    status = json.loads(status_file.read_text())
    assert len(status["files"]) >= 3
    status_file.write_text(json.dumps({**status, "files": status["files"][:1]}))
    notes = tmp_path / "NOTES.md"
    notes.write_text('"clouseau.capture/1"')
    _capture(tmp_path, 2)  # replaces the earlier capture, every file of it
    cap = load(tmp_path, strict=True)
    assert cap.calls == (0, 1) and cap.complete
    for call in cap.calls:
        np.testing.assert_array_equal(cap.get("relu", call=call), np.full(64, float(call)))
    assert notes.read_text() == '"clouseau.capture/1"'
