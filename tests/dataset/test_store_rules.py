"""record() follows the store's rules: one writer per directory, other people's files untouched."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import clouseau  # noqa: E402
from tests.dataset.models import seeded_mlp, vectors  # noqa: E402


def test_record_refuses_a_directory_another_writer_holds(tmp_path) -> None:
    model, data = seeded_mlp().eval(), vectors(3)
    with clouseau.instrument(model, select="*", path=tmp_path) as fmodel:
        fmodel(data[0])
        with pytest.raises(clouseau.CaptureError, match="another instrumented model"):
            clouseau.record(model, data, select="*", path=tmp_path, progress=False)
    cap = clouseau.load(tmp_path)  # the first writer's capture is whole
    assert cap.calls == (0,)


def test_record_leaves_the_users_files_alone(tmp_path) -> None:
    model, data = seeded_mlp().eval(), vectors(3)
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"mine": True}))
    cap = clouseau.record(model, data, select="*", path=tmp_path, progress=False)
    clouseau.record(model, data, select="*", path=tmp_path, progress=False)  # replaces its own
    assert json.loads(notes.read_text()) == {"mine": True}
    assert len(clouseau.load(tmp_path).calls) == len(cap.calls) == len(data)


def test_record_refuses_a_clash_with_a_foreign_file(tmp_path) -> None:
    model, data = seeded_mlp().eval(), vectors(3)
    foreign = tmp_path / "activations-000.safetensors"
    foreign.write_bytes(b"not clouseau's")
    with pytest.raises(clouseau.CaptureError, match="is in the way"):
        clouseau.record(model, data, select="*", path=tmp_path, progress=False)
    assert foreign.read_bytes() == b"not clouseau's"


def test_record_values_equal_eager(tmp_path) -> None:
    model, data = seeded_mlp().eval(), vectors(3)
    cap = clouseau.record(model, data, select="*", path=tmp_path, progress=False)
    with torch.no_grad():
        for call, batch in zip(cap.calls, data, strict=True):
            np.testing.assert_array_equal(cap.get(cap.names()[-1], call=call), model(batch).numpy())
