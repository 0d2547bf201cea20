"""Headless Chromium from Debian, driven by Playwright for Python (never a downloaded browser).

`browser()` yields a launched browser, or skips the test with the reason where Debian's
`chromium` or the `playwright` package is missing (`make test` installs both). Screenshots go
under the test's tmp dir and are copied to `screenshots-out/` at the repository root
(untracked) for people to look at.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",  # as root Chromium needs it; the tests' pages are our own
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "screenshots-out"


@contextmanager
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/system-deps.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (the dev extra has it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield b
        finally:
            b.close()


def screenshot(page: Any, tmp: Path, name: str) -> Path:
    """The whole page as `<tmp>/screenshots/<name>.png`, copied to screenshots-out/."""
    path = tmp / "screenshots" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    SCREENSHOTS.mkdir(exist_ok=True)
    shutil.copy(path, SCREENSHOTS / path.name)
    return path
