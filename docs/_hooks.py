"""mkdocs hook: pages hold generated text, never text typed by hand that could drift.

``<!-- cli-help: show -->`` on a line of its own becomes the ``clouseau show --help``
text, as the installed command prints it (``<!-- cli-help: -->`` for ``clouseau --help``).
After the build, the explorer's pages of the quickstart model (``examples/explore.py``) are
written beside ``explorer.md``'s page, which embeds them.
"""

from __future__ import annotations

import os
import re
from typing import Any

_MARKER = re.compile(r"^<!-- cli-help:\s*([\w-]*)\s*-->$", re.M)


def cli_help(command: str) -> str:
    """The ``--help`` text of ``clouseau COMMAND`` (of ``clouseau`` when empty), 88 columns."""
    from clouseau.cli import _parser

    parser = _parser()
    if command:
        parser = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps at the terminal width; pin it
    try:
        return parser.format_help().rstrip()
    finally:
        if saved is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = saved


def on_post_build(config: Any, **_: Any) -> None:
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    try:
        from explore import write_reports
    finally:
        sys.path.pop(0)
    out = Path(config["site_dir"]) / "explorer"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:  # the captures stay out of the site
        for page in write_reports(Path(work)):
            shutil.copyfile(page, out / page.name)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return _MARKER.sub(lambda m: f"```text\n{cli_help(m.group(1))}\n```", markdown)
