"""The explorer on the quickstart model: one capture, and a diff with one perturbed layer.

Writes ``report.html`` (the graph with statistics of every ReLU) and ``diff.html`` (the
same model with ``layer2.0.conv2`` perturbed, compared point by point: the first
divergence is highlighted) into a directory, by default a temporary one::

    python examples/explore.py [OUT_DIR] [--screenshot docs/explorer.png]

Open either file in a browser straight from disk: no server, no network. The docs site
embeds these two pages; ``--screenshot`` (needs Playwright and Chromium) writes the PNG the
README shows.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch
from quickstart_torch import ResNet  # the script's folder is on sys.path when run as a script

import clouseau


def write_reports(out: Path) -> tuple[Path, Path]:
    """Capture the quickstart model twice (once perturbed) and write both pages into ``out``."""
    torch.manual_seed(0)
    model = ResNet().eval()
    x = torch.randn(4, 3, 32, 32)
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        perturbed.layer2[0].conv2.weight.mul_(1.1)
    for name, net in (("run-a", model), ("run-b", perturbed)):
        with clouseau.instrument(net, select="*", path=out / name) as fmodel:
            fmodel(x)
    report = clouseau.explore(
        out / "run-a", out / "report.html", depth=2, title="quickstart ResNet"
    )
    diff = clouseau.explore(
        (out / "run-a", out / "run-b"),
        out / "diff.html",
        title="quickstart ResNet: layer2.0.conv2 perturbed",
    )
    return report, diff


def screenshot(page: Path, png: Path) -> None:
    """A 1200x700 screenshot of ``page`` with a saved ReLU selected."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])  # fmt: skip
        tab = browser.new_page(viewport={"width": 1200, "height": 700})
        tab.goto(page.resolve().as_uri())
        tab.wait_for_selector("body[data-ready]")
        found = tab.evaluate("window.clouseauExplorer.show('layer1.1.relu')")
        tab.locator(f'.node[data-id="{found}"]').click()
        tab.select_option("#colour-by", "absmean")
        tab.screenshot(path=str(png))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", help="output directory (default: a temporary one)")
    parser.add_argument(
        "--screenshot", metavar="PNG", help="also write a screenshot of report.html"
    )
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="clouseau-explore-"))
    report, diff = write_reports(out)
    print(f"wrote {report} and {diff}: open them in a browser")
    if args.screenshot:
        screenshot(report, Path(args.screenshot))
        print(f"wrote {args.screenshot}")


if __name__ == "__main__":
    main()
