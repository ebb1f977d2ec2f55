"""A screenshot of an HTML report in headless Chromium, through the same path as the
browser tests (tests/browser.py): the page must render with no console error.

    python scripts/report_screenshot.py demo-results/<run>/report.html docs/report.png --colors 64

Run from the repository root (the test helpers import as ``tests``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.browser import load

READY = "!!(window.Bokeh && Bokeh.documents.length && Object.values(Bokeh.index).every(v => v.has_finished()))"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html")
    ap.add_argument("png")
    ap.add_argument("--width", type=int, default=1100)
    ap.add_argument(
        "--max-height",
        type=int,
        default=1500,
        help="keep the top of the page only (default 1500 px)",
    )
    ap.add_argument(
        "--colors",
        type=int,
        default=None,
        help="reduce to this many colours (a small PNG for the docs; Pillow)",
    )
    a = ap.parse_args()
    page = asyncio.run(
        load(a.html, check=READY, screenshot=a.png, width=a.width, max_height=a.max_height)
    )
    if page.errors or not page.result:
        print("\n".join(page.errors) or "the charts did not finish rendering", file=sys.stderr)
        return 1
    if a.colors:
        from PIL import Image  # a dependency of Bokeh, so there with the html extra

        with Image.open(a.png) as im:
            small = im.convert("P", palette=Image.Palette.ADAPTIVE, colors=a.colors)
        small.save(a.png, optimize=True)
    print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
