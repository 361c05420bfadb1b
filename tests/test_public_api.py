"""The public surface of clouseau is exactly DESIGN.md's, and imports no framework."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import clouseau

PUBLIC = {
    "Capture", "CaptureError", "ClouseauError", "Graph", "Point", "SelectionError", "Selector",
    "TraceError", "diff", "draw", "export_onnx", "instrument", "load", "record", "trace",
    # the HTML explorer (DESIGN.md round 2, docs/explorer.md)
    "explore",
    # interventions (docs/interventions.md)
    "add", "clamp", "mean_ablate", "noise", "patch", "replace", "scale", "zero",
    # torch.compile (DESIGN.md round 2)
    "backend",
}  # fmt: skip


def test_public_names_are_exactly_the_documented_ones():
    assert set(clouseau.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(clouseau, name).__doc__, f"clouseau.{name} has no docstring"


def _run_hidden(code: str, hidden: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    # A meta-path finder that refuses the hidden frameworks, as if they were not installed.
    prelude = textwrap.dedent(
        f"""
        import sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in {hidden!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}")
        sys.meta_path.insert(0, Hide())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, check=False
    )


def test_import_works_without_torch_or_jax():
    result = _run_hidden(
        "import clouseau, sys; import clouseau.ir, clouseau.store, clouseau.exporters;"
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules; print('ok')",
        ("torch", "jax", "jaxlib", "equinox", "onnx", "onnxruntime", "safetensors"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_import_needs_none_of_the_frameworks_the_architecture_page_names():
    # docs/architecture.md: torch, jax, onnx, graphviz, pandas, rich are imported lazily.
    hidden = ("torch", "jax", "onnx", "graphviz", "pandas", "rich")
    result = _run_hidden("import clouseau; print('ok')", hidden)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_missing_framework_names_the_extra_to_install():
    result = _run_hidden(
        textwrap.dedent(
            """
            import clouseau
            class FakeModule:
                __module__ = 'torch.nn'
                def __call__(self, x): return x
            try:
                clouseau.trace(lambda x: x, 1.0)
            except TypeError as err:
                print(err)
            """
        ),
        ("torch", "jax", "jaxlib", "equinox"),
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'clouseau[torch]'" in result.stdout


FRAMEWORKS = {
    "torch",
    "jax",
    "jaxlib",
    "equinox",
    "numpy",
    "ml_dtypes",
    "onnx",
    "onnxruntime",
    "safetensors",
    "graphviz",
}
PACKAGE = Path(clouseau.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_ir_imports_no_framework():
    for path in (PACKAGE / "ir").rglob("*.py"):
        bad = {m for m in _imports(path) if m.split(".")[0] in FRAMEWORKS}
        assert not bad, f"{path.name} imports {bad}: clouseau/ir must stay framework-free"


def test_frontends_and_exporters_do_not_import_each_other():
    layers = {"capture.torch", "capture.jax", "exporters"}
    for layer in layers:
        folder = PACKAGE / layer.replace(".", "/")
        for path in folder.rglob("*.py") if folder.exists() else ():
            others = {f"clouseau.{o}" for o in layers - {layer}}
            bad = {m for m in _imports(path) if any(m.startswith(o) for o in others)}
            assert not bad, f"{path} imports {bad}"


def test_subpackages_are_attributes_imported_on_first_use():
    # TraceError's fix names clouseau.capture.torch.mark_leaf: it must work as written.
    code = textwrap.dedent(
        """
        import sys, clouseau
        frameworks = lambda: {'torch', 'jax'} & set(sys.modules)
        assert not frameworks()
        assert callable(clouseau.inspector.tail) and callable(clouseau.store.load)
        assert clouseau.ir.Graph is clouseau.Graph and callable(clouseau.cli.main)
        assert not frameworks(), frameworks()
        assert callable(clouseau.capture.torch.mark_leaf) and frameworks() == {'torch'}
        assert callable(clouseau.capture.jax.trace)
        assert {'inspector', 'capture', 'store'} <= set(dir(clouseau))
        try:
            clouseau.nothing
        except AttributeError as err:
            assert "has no attribute 'nothing'" in str(err)
        print('ok')
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
