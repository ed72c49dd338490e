"""A report page as Debian's headless Chromium lays it out at 1,280 px: what its self-check recorded on
<body> (case_env/eval/report.py) and a screenshot of the first screen."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image

WIDTH, FOLD = 1280, 900


def _chromium() -> list[str]:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: `make test` installs it"
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
    ]


def laid_out(page: Path) -> dict[str, int]:
    """The page's self-check at a 1,280 x 900 window: images, table rows, overflow, plot widths, positions."""
    flags = [*_chromium(), f"--window-size={WIDTH},{FOLD}"]
    dom = subprocess.run(
        [*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[-2000:]
    return {k: int(v) for k, v in re.findall(r'data-([a-z-]+)="(-?\d+)"', body.group())}


def first_screen(page: Path, out: Path) -> np.ndarray:
    """A grey-level screenshot of what a reader sees first at 1,280 px."""
    flags = [*_chromium(), f"--window-size={WIDTH},{FOLD}"]
    subprocess.run(
        [*flags, f"--screenshot={out}", page.as_uri()], capture_output=True, timeout=120, check=True
    )
    return np.asarray(Image.open(out).convert("L"))


def assert_reads_at_a_glance(page: Path, tmp: Path) -> dict[str, int]:
    """Summary and first plot above the fold, no horizontal scroll, every plot at least 600 px wide."""
    seen = laid_out(page)
    assert seen["images-broken"] == 0
    assert seen["overflow-x"] == 0, seen
    assert 0 <= seen["summary-top"] < FOLD, seen
    if seen["plots"]:
        assert 0 <= seen["plot-top"] < FOLD and seen["plot-min-width"] >= 600, seen
    pixels = first_screen(page, tmp / f"{page.parent.name}-first-screen.png")
    assert pixels.shape == (FOLD, WIDTH)
    assert (pixels < 128).any(axis=1).mean() > 0.2  # text, table rules and a plot, not a blank screen
    return seen
