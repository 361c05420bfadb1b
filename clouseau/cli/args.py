"""Strict argument types and exit statuses of the ``clouseau`` command.

Every value is checked while the command line is parsed, so a malformed argument ends the
command with exit status 2 and one line on stderr (``clouseau show: error: ...``), before
any work starts and never with a traceback.
"""

from __future__ import annotations

import argparse
import enum
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from clouseau.ir.errors import SelectionError
from clouseau.ir.selection import Selector


class Exit(enum.IntEnum):
    """The exit statuses of the ``clouseau`` command."""

    OK = 0
    DIFFERS = 1  # diff found a difference
    USAGE = 2  # a user error: a malformed argument, a bad path, not a capture
    INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C (128 + SIGINT)


# Inputs are allocated in memory: refuse a shape that is a typo for a huge one.
MAX_INPUT_ELEMENTS = 2**28
MAX_SEED = 2**32 - 1
DTYPES = (
    "float16", "bfloat16", "float32", "float64",
    "int8", "int16", "int32", "int64", "uint8", "bool",
)  # fmt: skip
DRAW_SUFFIXES = (".pdf", ".svg", ".png", ".dot")


class StrictParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit 2), no usage dump."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        sys.stderr.write(f"{self.prog}: error: {line} (see {self.prog} --help)\n")
        sys.exit(Exit.USAGE)


def add_width(parser: argparse.ArgumentParser) -> None:
    """Add ``--width N``, the output width (default: the terminal's; unlimited in a pipe)."""
    parser.add_argument(
        "--width",
        type=width,
        metavar="N",
        help="wrap output at N columns (default: the terminal's width; unlimited in a pipe)",
    )


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(str(text).split())


def _typed(name: str, check: Callable[[str], object]) -> Callable[[str], object]:
    # argparse reports ArgumentTypeError's message as is (ValueError as "invalid <name>").
    def parse(text: str) -> object:
        try:
            return check(text)
        except (ValueError, SelectionError) as err:
            raise argparse.ArgumentTypeError(one_line(str(err))) from None

    parse.__name__ = name
    return parse


def _integer(text: str, low: int, high: int | None = None) -> int:
    if not re.fullmatch(r"[+-]?\d+", text.strip(), re.ASCII):
        raise ValueError(f"expected an integer, not {text!r}")
    value = int(text)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"expected an integer {bound}, not {value}")
    return value


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"a tolerance is a number such as 1e-4, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a tolerance is a finite number >= 0, not {text!r}")
    return value


def _glob(text: str) -> str:
    pattern = text[1:] if text.startswith("!") else text
    Selector.glob(pattern)  # SelectionError("invalid glob ...") for a malformed one
    return text


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as err:
        raise ValueError(f"invalid regular expression {text!r}: {err}") from None
    return text


def _existing(text: str) -> Path:
    path = Path(text)
    if not text or not path.exists():
        raise ValueError(f"{text!r} does not exist")
    return path


def _output(text: str, suffixes: tuple[str, ...] = ()) -> Path:
    path = Path(text)
    if not text or path.is_dir() or text.endswith(("/", "\\")):
        raise ValueError(f"{text!r} is a directory; give a file name")
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{text!r} needs one of the suffixes {', '.join(suffixes)}")
    parent = path.parent
    if not parent.is_dir():
        # Creating a directory tree from a typo would hide the typo.
        raise ValueError(
            f"the directory {str(parent)!r} of {text!r} does not exist; create it first"
        )
    return path


def parse_input(spec: str) -> tuple[tuple[int, ...], str]:
    """``"2,3,32,32"`` -> ((2, 3, 32, 32), "float32"); ``"2,16:int64"`` -> ((2, 16), "int64").

    Raises
    ------
    ValueError
        A size that is not a positive integer, an empty shape, an unknown dtype, or more
        than ``MAX_INPUT_ELEMENTS`` elements; the message shows the accepted form.
    """
    form = "comma-separated positive sizes with an optional :dtype, e.g. 2,3,32,32 or 2,16:int64"
    shape_text, sep, dtype = spec.partition(":")
    sizes = shape_text.split(",")
    if not all(re.fullmatch(r"[1-9]\d*", s, re.ASCII) for s in sizes):
        raise ValueError(f"{spec!r}: expected {form}")
    shape = tuple(int(s) for s in sizes)
    if sep and dtype not in DTYPES:
        raise ValueError(f"{spec!r}: unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise ValueError(
            f"{spec!r}: {math.prod(shape)} elements is more than the "
            f"{MAX_INPUT_ELEMENTS} an example input may have"
        )
    return shape, dtype if sep else "float32"


def _model_spec(spec: str) -> str:
    module, sep, attr = spec.rpartition(":")
    if not (sep and module and attr) or not all(p.isidentifier() for p in attr.split(".")):
        raise ValueError(
            f"MODEL {spec!r} must be MODULE:ATTR, e.g. mypkg.models:make_model or models.py:Net"
        )
    return spec


def count(low: int = 0, high: int | None = None) -> Callable[[str], object]:
    """An argparse type: an integer in ``[low, high]``."""
    return _typed("count", lambda text: _integer(text, low, high))


tolerance = _typed("tolerance", _tolerance)
glob = _typed("glob", _glob)
regex = _typed("regex", _regex)
existing_path = _typed("path", _existing)
onnx_output = _typed("output", _output)
draw_output = _typed("output", lambda text: _output(text, DRAW_SUFFIXES))
html_output = _typed("output", lambda text: _output(text, (".html", ".htm")))
input_spec = _typed("input", parse_input)
model_spec = _typed("model", _model_spec)
width = count(20, 100_000)
seed = count(0, MAX_SEED)
