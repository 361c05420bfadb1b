"""The Python code blocks of README.md and docs/, as the doc tests run them.

A block is a fenced ```` ```python ```` block (indented ones inside lists included).
``<!-- skip: reason -->`` on the line right before the fence marks a block that cannot
run here; the tests skip it visibly with that reason. A line ``--8<-- "path"`` (the
snippets extension of the docs site) stands for the file at ``path``, relative to the
repository root, so a page that shows an example script runs that script.

A ```` ```console ```` block whose lines start ``$ clouseau ...`` shows commands and their
output; the tests run each command (after the page's earlier Python blocks, in the same
directory) and compare its output with the text shown.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)[^\n]*$")
_SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.+?)\s*-->\s*$")
_SNIPPET = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')
PYTHON = frozenset({"python", "py"})
CONSOLE = "console"


@dataclass(frozen=True)
class Block:
    """One Python block of a page: where it starts, its code, why it is skipped (if so)."""

    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip: str | None
    kind: str = "python"  # or CONSOLE

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compiled(self) -> object:
        """The code compiled under the page's path, with the page's line numbers."""
        padded = "\n" * self.line + self.code
        return compile(padded, str(self.page), "exec", dont_inherit=True)


def pages() -> tuple[Path, ...]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))


def blocks(page: Path) -> tuple[Block, ...]:
    """The Python and ``$ clouseau`` console blocks of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = _closing(lines, i, opening.group("fence"))
        lang = opening.group("lang").lower()
        body = textwrap.dedent("\n".join(lines[i + 1 : end]))
        skip = _SKIP.match(lines[i - 1]) if i else None
        reason = skip.group("reason") if skip else None
        if lang in PYTHON:
            found.append(Block(page, i + 1, _expand(body), reason))
        elif lang == CONSOLE and body.startswith("$ clouseau "):
            found.append(Block(page, i + 1, body + "\n", reason, CONSOLE))
        i = end + 1
    return tuple(found)


def _closing(lines: list[str], start: int, fence: str) -> int:
    for j in range(start + 1, len(lines)):
        text = lines[j].strip()
        if text.startswith(fence[0] * len(fence)) and not text.strip(fence[0]):
            return j
    raise ValueError(f"unclosed code fence at line {start + 1}")


def _expand(code: str) -> str:
    out = []
    for line in code.splitlines():
        snippet = _SNIPPET.match(line.strip())
        out.append((ROOT / snippet.group("path")).read_text() if snippet else line)
    return "\n".join(out) + "\n"


def commands(block: Block) -> list[tuple[list[str], str]]:
    """The ``clouseau`` commands of a console block (argv after ``clouseau``) and their output."""
    import shlex

    runs: list[tuple[list[str], str]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            runs.append((shlex.split(line[2:])[1:], ""))
        else:
            argv, shown = runs[-1]
            runs[-1] = (argv, shown + line + "\n")
    return runs
