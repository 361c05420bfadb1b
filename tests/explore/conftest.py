"""A real headless Chromium driven by Playwright, shared by the explorer's browser tests.

The tests skip, saying why, where Playwright or the browser is missing; ``./dev.sh test``
installs Debian's ``chromium`` with apt-get where it can. ``CLOUSEAU_CHROMIUM`` points at
another Chromium binary.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str | None:
    for candidate in (os.environ.get("CLOUSEAU_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright is not installed: pip install 'clouseau[dev]'")
    exe = _chromium()
    if exe is None:
        pytest.skip(
            "no Chromium found (/usr/bin/chromium, or set CLOUSEAU_CHROMIUM): "
            "apt-get install chromium, or run ./dev.sh test, which installs it"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Opened:
    """A report opened in a fresh page, with every request and page error it caused."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.url = path.resolve().as_uri()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready]", timeout=60_000)

    def network(self) -> list[str]:
        """Requests other than the report itself (a self-contained page makes none)."""
        return [u for u in self.requests if u != self.url]

    def show(self, name: str) -> Any:
        """The node (or group box) called ``name``, scrolled into the view."""
        found = self.page.evaluate("(n) => window.clouseauExplorer.show(n)", name)
        assert found, f"{name!r} is neither a point, a node nor a group of the page"
        return self.page.locator(f'.node[data-id="{found}"]')

    def shot(self, path: Path) -> Path:
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        assert not self.errors, f"the page reported errors: {self.errors}"
        self.page.close()


@pytest.fixture
def open_report(browser: Any) -> Iterator[Any]:
    pages: list[Opened] = []

    def opener(path: Path) -> Opened:
        pages.append(Opened(browser, path))
        return pages[-1]

    yield opener
    for page in pages:
        page.close()
