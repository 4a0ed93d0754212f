"""axe-core in the console tests: the engine the PyPI package `axe-playwright-python` ships
(axe.min.js, no CDN, installed by `make install` with the dev extras), run in the page, and
keyboard checks. `serious_violations` lists what a test must not find."""

from __future__ import annotations

import os
from pathlib import Path

import axe_playwright_python

AXE_JS = Path(axe_playwright_python.__file__).with_name("axe.min.js")
BLOCKING = ("serious", "critical")
# AGENTMESH_SCREENSHOTS_DIR=docs/images: the view tests save their screenshots there.
SCREENSHOTS = os.environ.get("AGENTMESH_SCREENSHOTS_DIR", "")


async def serious_violations(page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now, one line each."""
    # Injected through the DevTools protocol (page.evaluate): the console's CSP refuses inline scripts.
    if not await page.evaluate("typeof window.axe !== 'undefined'"):
        await page.evaluate(AXE_JS.read_text(encoding="utf-8"))
    result = await page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:5]}"
            for v in result["violations"] if v["impact"] in BLOCKING]


async def focus_by_keyboard(page, name: str, limit: int = 150) -> None:
    """Press Tab until the element named `name` (its accessible name, as aria-label or text) has
    focus, and check the focus is drawn (an outline): fails when Tab never reaches it."""
    for _ in range(limit):
        await page.keyboard.press("Tab")
        found = await page.evaluate(
            "(name) => { const e = document.activeElement; if (!e) return null;"
            " const label = e.getAttribute('aria-label') || e.textContent.trim();"
            " if (label !== name) return null; const style = getComputedStyle(e);"
            " return {outline: style.outlineStyle, width: style.outlineWidth}; }", name)
        if found is not None:
            assert found["outline"] != "none" and found["width"] != "0px", f"no visible focus on {name!r}: {found}"
            return
    raise AssertionError(f"Tab never reached {name!r}")


async def screenshot(page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=Path(SCREENSHOTS) / f"console-{name}.png")
