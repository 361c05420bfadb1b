"""A TraceError names the user's own line, and torch.export's fallback prints nothing."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import clouseau

ROOT = Path(__file__).resolve().parents[2]


def _line_of(marker: str) -> int:
    source, start = inspect.getsourcelines(sys.modules[__name__])
    return next(i for i, text in enumerate(source, start or 1) if marker in text)


def test_torch_error_inside_torch_names_the_users_call() -> None:
    torch = pytest.importorskip("torch")
    # Linear fails inside torch: no frame of the user's in the traceback but the call.
    with pytest.raises(clouseau.TraceError) as info:
        clouseau.trace(torch.nn.Linear(4, 4), torch.randn(2, 5))  # CALL-TRACE
    first = str(info.value).splitlines()[0]
    assert f" at {__file__}:{_line_of('# CALL-TRACE')} (clouseau.trace(" in first
    assert "clouseau/api.py" not in str(info.value)


def test_torch_export_onnx_error_names_the_users_call(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model, x, out = torch.nn.Linear(4, 4), torch.randn(2, 5), tmp_path / "m.onnx"
    with pytest.raises(clouseau.TraceError) as info:
        clouseau.export_onnx(model, (x,), out)  # CALL-EXPORT
    assert f" at {__file__}:{_line_of('# CALL-EXPORT')} " in str(info.value)
    assert "clouseau/" not in str(info.value).split(" at ", 1)[1].split(")", 1)[0]


def test_torch_error_in_the_model_names_the_model_line() -> None:
    torch = pytest.importorskip("torch")
    from tests.reliability import models

    with pytest.raises(clouseau.TraceError) as info:
        clouseau.trace(models.ValueBranch(), torch.randn(2, 4))
    source = inspect.getsource(models)
    line = source[: source.index("# BRANCH-LINE")].count("\n") + 1
    assert f" at {models.__file__}:{line} (if y.sum() > 0:" in str(info.value)


def test_jax_error_inside_jax_names_the_users_call() -> None:
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(clouseau.TraceError) as info:
        clouseau.trace(jnp.dot, jnp.ones((2, 3)), jnp.ones((4, 5)))  # CALL-JAX
    assert f" at {__file__}:{_line_of('# CALL-JAX')} (clouseau.trace(jnp.dot" in str(info.value)


def test_fix_named_in_the_trace_error_is_reachable_after_import_clouseau() -> None:
    torch = pytest.importorskip("torch")
    from tests.reliability import models

    with pytest.raises(clouseau.TraceError) as info:
        clouseau.trace(models.ValueBranch(), torch.randn(2, 4))
    assert "clouseau.capture.torch.mark_leaf(model.<path>)" in str(info.value)
    assert callable(clouseau.capture.torch.mark_leaf)


SCRIPT = """
import threading, sys, torch, clouseau
from tests.reliability.models import ValueBranch

def chatter():
    for _ in range(200):
        sys.stderr.write("other thread\\n")

thread = threading.Thread(target=chatter)
thread.start()
try:
    clouseau.trace(ValueBranch(), torch.randn(2, 4))
except clouseau.TraceError as err:
    print("TraceError", str(err).splitlines()[0])
thread.join()
sys.stderr.write("after\\n")
"""


def test_torch_export_fallback_prints_nothing() -> None:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("TraceError cannot trace ValueBranch at ")
    # Only the other thread's lines and ours after the trace: no graph dump, no log record.
    lines = done.stderr.splitlines()
    assert set(lines) == {"other thread", "after"}, done.stderr[:2000]
    assert lines.count("other thread") == 200 and lines[-1] == "after"
