"""Every import path the CLI and the seed's API had before they became packages still
works, and names the same object as its new home."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import clouseau

ROOT = Path(__file__).resolve().parents[1]
INSPECTOR = (
    "DEFAULT_PATH", "FrameworkEnum", "capture_directory", "is_jax_model", "is_torch_model",
    "magnify", "read_from_safetensors", "tail",
)  # fmt: skip

# (old module, name, the module that defines it now)
OLD_PATHS = [
    *(("clouseau.inspector", name, "clouseau.inspector") for name in INSPECTOR),
    ("clouseau.magnifier", "magnify", "clouseau.inspector"),
    ("clouseau.magnifier", "read_from_safetensors", "clouseau.inspector"),
    ("clouseau.cli", "main", "clouseau.cli"),
    ("clouseau.cli", "parse_input", "clouseau.cli.args"),
    ("clouseau.cli", "load_factory", "clouseau.cli.export_onnx"),
    ("clouseau.cli", "make_inputs", "clouseau.cli.export_onnx"),
]


@pytest.mark.parametrize(("old", "name", "home"), OLD_PATHS)
def test_an_old_import_path_names_the_same_object(old: str, name: str, home: str) -> None:
    found = getattr(importlib.import_module(old), name)
    assert found is getattr(importlib.import_module(home), name)
    assert name in importlib.import_module(old).__all__


def test_the_seed_imports_work_as_the_seed_wrote_them() -> None:
    from clouseau import inspector, magnifier

    assert inspector is clouseau.inspector and magnifier.magnify is inspector.magnify
    assert clouseau.inspector.tail is inspector.tail


def test_the_console_script_is_the_cli_main() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["clouseau"].partition(":")
    assert getattr(importlib.import_module(module), attr) is clouseau.cli.main


def test_python_m_clouseau_cli_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "clouseau.cli", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    for command in ("show", "diff", "draw", "explore", "export-onnx"):
        assert command in result.stdout
