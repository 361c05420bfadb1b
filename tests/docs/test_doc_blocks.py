"""Every Python block of README.md and docs/ runs as written.

One test per block, in page order; the blocks of a page share one namespace (as a reader
runs them one after another) and run in a fresh directory of their own. A block marked
``<!-- skip: reason -->`` is skipped with that reason, visibly. A ``$ clouseau ...``
console block is run there too, and its output must be the one the page shows.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from clouseau.cli import main
from tests.docs.blocks import CONSOLE, ROOT, Block, blocks, commands, pages

ALL = tuple(b for page in pages() for b in blocks(page))


class _Page:
    """The state a page's blocks share: their namespace, directory, and the first failure."""

    def __init__(self, directory: Path) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.directory = directory
        self.failed: str | None = None


_PAGES: dict[Path, _Page] = {}


def _page(block: Block, factory: pytest.TempPathFactory) -> _Page:
    if block.page not in _PAGES:
        _PAGES[block.page] = _Page(factory.mktemp(block.page.stem))
    return _PAGES[block.page]


@pytest.mark.parametrize("block", ALL, ids=[b.where for b in ALL])
def test_block_runs(
    block: Block, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    if block.skip:
        pytest.skip(f"{block.where}: {block.skip}")
    page = _page(block, tmp_path_factory)
    if page.failed:
        pytest.fail(f"not run: an earlier block of the page failed ({page.failed})")
    cwd, tmp, argv = Path.cwd(), tempfile.tempdir, sys.argv
    os.chdir(page.directory)
    tempfile.tempdir = str(page.directory)  # the examples' mkdtemp() too
    # As `python examples/x.py` would: no arguments, the script's folder importable.
    sys.argv, sys.path[:0] = [block.where], [str(ROOT / "examples")]
    try:
        if block.kind == CONSOLE:
            _run_console(block, capsys)
        else:
            exec(block.compiled(), page.namespace)
    except BaseException:
        page.failed = block.where
        raise
    finally:
        os.chdir(cwd)
        tempfile.tempdir, sys.argv = tmp, argv
        sys.path.remove(str(ROOT / "examples"))


def _run_console(block: Block, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, shown in commands(block):
        capsys.readouterr()
        main(argv)
        out, err = capsys.readouterr()
        printed = "".join(line.rstrip() + "\n" for line in (out + err).splitlines())
        assert printed == shown, f"clouseau {' '.join(argv)} printed:\n{printed}"


def test_every_example_script_is_on_the_examples_page() -> None:
    # The examples page includes each script, so running its blocks runs every script.
    page = (ROOT / "docs" / "examples.md").read_text()
    for script in sorted((ROOT / "examples").glob("*.py")):
        assert f'--8<-- "examples/{script.name}"' in page, f"{script.name} is not on examples.md"


def test_blocks_are_found_and_skips_say_why() -> None:
    assert len(ALL) >= 20 and len({b.page for b in ALL}) >= 8
    assert all(b.skip is None or len(b.skip) > 10 for b in ALL)
