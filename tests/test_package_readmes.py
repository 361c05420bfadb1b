"""Each package's README.md lists every module of the package, and names no file that is gone;
docs/architecture.md names no file that is gone and every member of the Frontend protocol.

A module is listed when the README names it in backticks: by its path from the README's
folder (``tiers/fx.py``; a subpackage's ``__init__.py`` also as ``tiers/``), or by its bare
file name when no other module below the README has that name. A subpackage with a
README of its own is that README's to list.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clouseau"
READMES = sorted(PACKAGE.rglob("README.md"))
# The packages a newcomer walks first; each must keep a README (issue #25).
REQUIRED = ("capture/torch", "capture/jax", "cli", "inspector")


def _modules(folder: Path) -> list[Path]:
    """The modules below ``folder`` that its README lists (not those of a nested README)."""
    nested = [r.parent for r in READMES if r.parent != folder and folder in r.parents]
    return sorted(
        path for path in folder.rglob("*.py") if not any(n in path.parents for n in nested)
    )


def _named(readme: Path) -> set[str]:
    return set(re.findall(r"`([^`\s]+)`", readme.read_text()))


def _spellings(module: Path, folder: Path, modules: list[Path]) -> set[str]:
    relative = module.relative_to(folder).as_posix()
    spellings = {relative}
    if sum(m.name == module.name for m in modules) == 1 and module.name != "__init__.py":
        spellings.add(module.name)
    if module.name == "__init__.py" and module.parent != folder:
        spellings.add(module.parent.relative_to(folder).as_posix() + "/")
    return spellings


def test_the_packages_a_newcomer_walks_have_a_readme() -> None:
    missing = [p for p in REQUIRED if not (PACKAGE / p / "README.md").is_file()]
    assert not missing, f"clouseau/{missing} have no README.md listing their modules"


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.parent.relative_to(ROOT).as_posix())
def test_the_readme_lists_every_module(readme: Path) -> None:
    folder, named = readme.parent, _named(readme)
    modules = _modules(folder)
    unlisted = [
        m.relative_to(folder).as_posix()
        for m in modules
        if not _spellings(m, folder, modules) & named
    ]
    assert not unlisted, f"{readme.relative_to(ROOT)} does not list {unlisted}"


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.parent.relative_to(ROOT).as_posix())
def test_the_readme_names_only_files_that_exist(readme: Path) -> None:
    folder = readme.parent
    names = {m.name for m in folder.rglob("*.py")}
    # A path is from the README's folder or from the repository's root.
    gone = [
        name
        for name in sorted(_named(readme))
        if name.endswith(".py")
        and not ((folder / name).is_file() or (ROOT / name).is_file() or name in names)
    ]
    assert not gone, f"{readme.relative_to(ROOT)} names {gone}, which do not exist"


def _architecture() -> str:
    return (ROOT / "docs" / "architecture.md").read_text()


def test_the_architecture_page_names_only_files_that_exist() -> None:
    named = set(re.findall(r"`((?:clouseau|tests|capture)/[^`\s]*)`", _architecture()))
    assert len(named) > 20
    gone = sorted(
        name
        for name in named
        if "<" not in name and not ((ROOT / name).exists() or (PACKAGE / name).exists())
    )
    assert not gone, f"docs/architecture.md names {gone}, which do not exist"


def test_the_architecture_page_names_every_member_of_the_frontend_protocol() -> None:
    from clouseau.capture import Frontend

    members = {n for n in vars(Frontend) if not n.startswith("_")} | set(Frontend.__annotations__)
    assert {"name", "trace", "instrument", "lower", "children"} <= members
    named = set(re.findall(r"`(\w+)`", _architecture()))
    assert members <= named, f"docs/architecture.md does not name {sorted(members - named)}"


def test_the_architecture_page_shows_each_group_of_the_torch_frontend() -> None:
    torch_dir = PACKAGE / "capture" / "torch"
    groups = sorted(p.parent.name for p in torch_dir.glob("*/__init__.py"))
    assert len(groups) >= 5
    text = _architecture()
    missing = [g for g in groups if f"`clouseau/capture/torch/{g}/`" not in text]
    assert not missing, f"docs/architecture.md's torch layout does not show {missing}"
