"""A figure a `python` cell draws, shown in the console's tool card (real headless Chromium against
the whole stack): as the turn runs, and again from the transcript when the session is reopened."""

from __future__ import annotations

import base64
import shutil

import pytest

from tests.support.llm_server import reply, tool_call
from tests.support.pictures import png
from tests.support.stack import Stack
from tests.tools.test_cell_results import write_png
from tests.web.browser import TIMEOUT_MS, PageErrors, launch, needs_chromium

pytestmark = [needs_chromium, pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect
expect.set_options(timeout=TIMEOUT_MS)
FIGURE = png(40, 30, shade=70)


@pytest.fixture
async def browser():
    async with playwright_api.async_playwright() as playwright:
        chromium = await launch(playwright)
        yield chromium
        await chromium.close()


@pytest.fixture
async def stack(tmp_path, llm):
    env = {"AGENTMESH_SANDBOX_ISOLATION": "session"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def test_the_tool_card_shows_the_figure_the_kernel_drew(browser, stack, llm):
    llm.add(reply("", tool_call("python", {"code": write_png(".outputs/plot.png", FIGURE)}, id="p1")),
            reply("Here is the plot."))
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors = PageErrors(page)
    await page.goto(stack.http_url + "/")
    await page.get_by_label("Message").fill("plot it")
    await page.get_by_label("Message").press("Enter")
    await expect(page.locator(".turn .bubble.assistant .text").last).to_have_text("Here is the plot.")

    expected = f"data:image/png;base64,{base64.b64encode(FIGURE).decode()}"
    figure = page.locator(".tool-card", has_text="python").locator("img.tool-figure")
    await expect(figure).to_be_visible()
    await expect(figure).to_have_attribute("src", expected)
    await expect(figure).to_have_attribute("alt", "plot.png")

    # Reopened, the card is rebuilt from the transcript, whose tool message names the stored figure.
    await page.reload()
    figure = page.locator(".tool-card", has_text="python").locator("img.tool-figure")
    await expect(figure).to_be_visible()
    await expect(figure).to_have_attribute("src", expected)
    errors.assert_none()
