"""The ``clouseau`` command's arguments: parsed strictly, one error line, never a traceback.

A table of malformed arguments (shapes, dtypes, paths, globs, numbers, options) for every
subcommand, each on an otherwise valid command line; then the output width and the paths
the command must not create.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clouseau.cli import main, parse_input
from tests.cli.test_diff import arrays, write_capture

ROOT = Path(__file__).resolve().parents[2]
CAP, OUT, MODEL = "{cap}", "{out}", "{model}"  # filled in per test (tmp_path)

BAD_SHAPES = (
    "", ",", "2,x", "x", "2,,3", ",2", "2,", "-1,3", "0,3", "2.5,3", "1e3", "2;3", "2 3",
    "2x3", "9" * 30, "99999,99999,99999", "2,3:", ":", ":float32", "nan", "inf", "0x10",
    "1٣", "²", "+2", "()", "[2,3]", "2,3 :int64",
)  # fmt: skip
BAD_DTYPES = (
    "int7", "bogus", "Float32", "torch.float32", "float32:x", "f4", "float", "int", "complex64",
    "float8", " float32", "float32 ", "FLOAT32", "np.int64", "str", "object", "", "bfloat",
)  # fmt: skip
BAD_GLOBS = ("relu[", "[", "!", "", "!relu[", "]", "!!relu", "a[b", "layer1.[0", "!]")
BAD_COUNTS = ("-1", "x", "1.5", "", "1e3", "nan", "0x1", "one", "--", "٣", "1 2")
BAD_TOLERANCES = ("-1", "nan", "inf", "-inf", "x", "", "1e-4x", "1,5", "0x1")
BAD_SEEDS = ("-1", "x", "4294967296", "1.0", "", "2**40")
BAD_WIDTHS = ("0", "19", "x", "-5", "100001", "", "80.5")
BAD_MODELS = ("nocolon", ":x", "x:", "x:1bad", "a:b c", "m.py:", "::", "m.py:a-b")
BAD_DRAW_OUTPUTS = ("/nonexistent/dir/x.pdf", "x.jpg", "x", "", "{tmp}", "{tmp}/", "x.PDFX")
BAD_HTML_OUTPUTS = ("/nonexistent/dir/r.html", "r.pdf", "", "{tmp}", "{tmp}/")
BAD_ONNX_OUTPUTS = ("/nonexistent/dir/m.onnx", "", "{tmp}", "{tmp}/sub/m.onnx")
MISSING = "/nonexistent/capture"
BAD_OPTIONS = ("--bogus", "-z", "--select", "--stats=1", "--call")


def _cases() -> list[tuple[str, ...]]:
    show, diff, draw = ("show", CAP), ("diff", CAP, CAP), ("draw", CAP, "-o", OUT)
    export = ("export-onnx", MODEL, "--input", "2,8")
    cases: list[tuple[str, ...]] = [(), ("bogus",), ("show",), ("diff", CAP), ("draw",)]
    cases += [("export-onnx", MODEL), ("export-onnx",), ("show", CAP, CAP)]
    cases += [("show", p) for p in (MISSING, "")] + [("draw", p) for p in (MISSING, "")]
    cases += [("diff", CAP, p) for p in (MISSING, "")] + [("diff", MISSING, CAP)]
    cases += [("export-onnx", MODEL, "--input", s) for s in BAD_SHAPES]
    cases += [("export-onnx", MODEL, "--input", f"2,8:{d}") for d in BAD_DTYPES]
    cases += [(*export, "--input", s) for s in BAD_SHAPES]  # a bad second input
    cases += [(*export, "--input", f"3:{d}") for d in BAD_DTYPES]
    for base, globs in ((show, BAD_GLOBS), (draw, BAD_GLOBS), (export, BAD_GLOBS)):
        cases += [(*base, "--select", g) for g in globs]
        cases += [(*base, "--select", "relu*", "--select", g) for g in globs[:3]]
    cases += [(*show, "--call", n) for n in BAD_COUNTS]
    cases += [(*draw, "--depth", n) for n in BAD_COUNTS]
    cases += [(*diff, f"--{t}", v) for t in ("rtol", "atol") for v in BAD_TOLERANCES]
    cases += [(*diff, "--key-map", p, "x") for p in ("(", "[a", "a**", "(?P<", "\\")]
    cases += [(*diff, "--key-map", "a"), (*diff, "--key-map")]
    cases += [(*export, "--seed", s) for s in BAD_SEEDS]
    cases += [(*base, "--width", w) for base in (show, diff) for w in BAD_WIDTHS]
    cases += [("export-onnx", m, "--input", "2,8") for m in BAD_MODELS]
    cases += [(*draw[:2], "-o", o) for o in BAD_DRAW_OUTPUTS]
    cases += [(*export, "-o", o) for o in BAD_ONNX_OUTPUTS]
    cases += [(*draw, "--rankdir", r) for r in ("XX", "tb", "", "LRX")]
    for base in (show, diff, draw, export):
        cases += [(*base, o) for o in BAD_OPTIONS if not (base is show and o == "--call")]
    cases += [(*draw, "extra"), (*export, "extra-positional")]
    explore = ("explore", CAP, "-o", "{html}")
    cases += [("explore",), ("explore", MISSING), ("explore", CAP, MISSING), (*explore, CAP, "x")]
    cases += [("explore", CAP, "-o", o) for o in BAD_HTML_OUTPUTS]
    cases += [(*explore, "--depth", n) for n in BAD_COUNTS]
    cases += [(*explore, CAP, f"--{t}", v) for t in ("rtol", "atol") for v in BAD_TOLERANCES]
    cases += [(*explore, o) for o in BAD_OPTIONS]
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("args")
    cap = write_capture(tmp / "cap", [arrays()])
    model = tmp / "mymodel.py"
    model.write_text("raise SystemExit('the model file must not be imported')\n")
    return {
        "cap": str(cap),
        "out": str(tmp / "g.dot"),
        "html": str(tmp / "r.html"),
        "model": f"{model}:make",
        "tmp": str(tmp),
    }


def test_the_table_is_a_few_hundred_cases() -> None:
    assert len(CASES) >= 250 and len(set(CASES)) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c)[:60] or "(no args)")
def test_malformed_arguments_exit_2_with_one_line(
    case: tuple[str, ...], places: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(**places) for a in case]
    before = sorted(Path(places["tmp"]).rglob("*"))
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "error:" in lines[0] and "Traceback" not in err and out == ""
    assert sorted(Path(places["tmp"]).rglob("*")) == before  # nothing written or created


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export-onnx", "m.py:f", "--input", "2,8:bogus"], "unknown dtype 'bogus'"),
        (["export-onnx", "m.py:f", "--input", "2,8:int7"], "unknown dtype 'int7'"),
        (["export-onnx", "m.py:f", "--input", "2,x"], "'2,x': expected comma-separated"),
        (["export-onnx", "m.py:f", "--input", ","], "',': expected comma-separated"),
        (["show", ".", "--select", "relu["], "invalid glob 'relu['"),
        (["draw", ".", "-o", "/nonexistent/dir/x.pdf"], "'/nonexistent/dir' of"),
        (["diff", ".", ".", "--rtol", "nan"], "finite number >= 0"),
    ],
)
def test_the_reported_cases_name_the_cause(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith(f"clouseau {argv[0]}: error: argument")


def test_a_real_process_prints_one_line(places: dict[str, str], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (
        ["show", places["cap"], "--select", "relu["],
        ["export-onnx", "m:f", "--input", "2,x"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "clouseau.cli", *argv], capture_output=True, text=True, env=env
        )
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


@given(st.text(max_size=12))
def test_parse_input_accepts_only_the_documented_form(spec: str) -> None:
    try:
        shape, dtype = parse_input(spec)
    except ValueError as err:
        assert repr(spec) in str(err)
        return
    text = spec.partition(":")[0]
    assert shape == tuple(int(s) for s in text.split(",")) and all(d > 0 for d in shape)
    assert dtype in {"float32", spec.partition(":")[2]}


def test_valid_inputs_parse() -> None:
    assert parse_input("2,3,32,32") == ((2, 3, 32, 32), "float32")
    assert parse_input("2,16:int64") == ((2, 16), "int64")
    assert parse_input("7:bool") == ((7,), "bool")


def test_output_in_a_pipe_is_never_cut(tmp_path: Path) -> None:
    name = "encoder.layers.11.attention.output.dense." + "x" * 80
    a = write_capture(tmp_path / "a", [{name: np.arange(9.0), "y": np.ones(2)}])
    b = write_capture(tmp_path / "b", [{name: np.arange(9.0) + 1, "y": np.ones(2)}])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    run = [sys.executable, "-m", "clouseau.cli"]
    show = subprocess.run(
        [*run, "show", str(a), "--stats"], capture_output=True, text=True, env=env
    )
    assert "x" * 80 + "  float64[9]  mean 4  std 2.582  min 0  max 8" in show.stdout
    diff = subprocess.run([*run, "diff", str(a), str(b)], capture_output=True, text=True, env=env)
    assert diff.returncode == 1 and f"│ 0 │ {name} │ differs │ [9]" in diff.stdout
    narrow = subprocess.run(
        [*run, "diff", str(a), str(b), "--width", "40"], capture_output=True, text=True, env=env
    )
    lines = narrow.stdout.splitlines()
    rows = [line for line in lines if line[:1] in "┏┃┡│└"]  # title and summary are text
    assert len(rows) > 5 and max(map(len, rows)) <= 40
    table = "".join(line.split("│")[2].strip() for line in lines if line.count("│") > 3)
    assert name in table  # folded over several lines, never elided


@pytest.mark.parametrize("command", ["draw", "export-onnx"])
def test_no_directory_is_created(command: str, places: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "not" / "there" / ("g.pdf" if command == "draw" else "m.onnx")
    argv = (
        ["draw", places["cap"], "-o", str(target)]
        if command == "draw"
        else ["export-onnx", places["model"], "--input", "2,8", "-o", str(target)]
    )
    assert main(argv) == 2
    assert not (tmp_path / "not").exists()


def test_every_subcommand_has_cases() -> None:
    commands = {c[0] for c in CASES if c}
    assert commands >= {"show", "diff", "draw", "export-onnx"}
    per_kind = itertools.groupby(sorted(c[0] for c in CASES if c))
    assert all(len(list(group)) >= 20 for key, group in per_kind if key != "bogus")


def test_ctrl_c_prints_one_line(
    monkeypatch: pytest.MonkeyPatch, places: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("clouseau.store.load", interrupted)
    assert main(["show", places["cap"]]) == 130
    assert capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize(
    "source, message",
    [
        ("raise RuntimeError('broken\\nmodule')", "error: RuntimeError: broken module"),
        ("make = 3", "error: clouseau cannot trace a int: pass a torch.nn.Module"),
        ("def make():\n    return object()", "error: clouseau cannot trace a object"),
        ("import no_such_module_here", "error: ModuleNotFoundError:"),
    ],
)
def test_a_broken_model_file_is_one_error_line(
    source: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "broken.py"
    model.write_text(source + "\n")
    assert (
        main(["export-onnx", f"{model}:make", "--input", "2,8", "-o", str(tmp_path / "m.onnx")])
        == 2
    )
    out, err = capsys.readouterr()
    assert err.startswith(message) and "Traceback" not in err and out == ""
    assert not (tmp_path / "m.onnx").exists()
