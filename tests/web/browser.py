"""Headless Chromium for the console tests: Debian's `chromium` (installed by `make install` and
.ci/run), driven by Playwright. Playwright's own browser downloads are never used."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and Path(p).exists()), "")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

# How long a console test waits for what it expects to appear (Playwright's expect, navigation,
# actions): a bound against a hang, never a measure of speed — with both cores busy and a full
# run beside it (load 70) loading the console page alone took over 20 s.
TIMEOUT_MS = 60_000

needs_chromium = pytest.mark.skipif(
    not CHROMIUM, reason="Debian's chromium is not installed (make install / .ci/run install it: apt-get install chromium)"
)


async def launch(playwright):
    return await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


class PageErrors:
    """JavaScript errors and failed console messages of a page, so a broken script fails the test."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        page.on("console", lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text}"))

    def assert_none(self, allowed: tuple[str, ...] = ()) -> None:
        left = [e for e in self.errors if not any(a in e for a in allowed)]
        assert left == [], left
