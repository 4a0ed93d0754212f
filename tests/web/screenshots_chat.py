"""Screenshots of the console's chat controls for docs/images/, taken in headless Chromium from a
real stack with a scripted model (as tests/web/screenshots.py takes the main screens):

    .venv/bin/python -m tests.web.screenshots_chat docs/images

- console-approval-edit.png: a held call with its arguments open for editing, approve the rest
  of the turn, deny with a note;
- console-busy.png: a message typed while a turn runs, and what it will do (if_busy), with the
  session's model and permission mode;
- console-fork.png: a session forked from a message of another, going on differently.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from playwright.async_api import async_playwright, expect

from agentmesh.v1 import gateway_pb2
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack
from tests.web.browser import TIMEOUT_MS, launch

WIDE = {"width": 1280, "height": 860}


async def take(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    expect.set_options(timeout=TIMEOUT_MS)
    with ScriptedLLMServer() as llm, tempfile.TemporaryDirectory() as home:
        env = {"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}
        async with Stack(Path(home), llm_base_url=llm.base_url, env=env) as stack, async_playwright() as playwright:
            gateway = stack.gateway_stub()
            llm.add(reply("", tool_call("write_file", {"path": "report.md", "content": "# Findings\n- latency down 4%\n"})),
                    reply("I wrote the findings to report.md."), reply("Next I would chart the weekly numbers."))
            for message in ("Summarise the findings in report.md", "What next?"):
                async for _ in gateway.Chat(gateway_pb2.ChatRequest(session_id="findings", message=message), timeout=60):
                    pass

            browser = await launch(playwright)
            page = await (await browser.new_context(viewport=WIDE, color_scheme="light")).new_page()
            await page.goto(stack.http_url + "/#/sessions/findings")
            fork = page.locator(".message", has_text="I wrote the findings").get_by_role("button", name="Fork the conversation at #4")
            await fork.click()
            await expect(page.locator("#subagents")).to_contain_text("Forked from findings")
            llm.add(reply("Instead, let us compare the numbers with last quarter's."))
            await page.get_by_label("Message").fill("Compare with last quarter instead")
            await page.get_by_label("Message").press("Enter")
            await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("last quarter's")
            await page.screenshot(path=out / "console-fork.png")

            llm.add(reply("Cleaning up first.", tool_call("shell", {"command": "rm -rf build && make report"}, id="s1")),
                    reply("Done."))
            await page.get_by_label("Message").fill("Rebuild the report")
            await page.get_by_label("Message").press("Enter")
            held = page.locator(".tool-card[data-state='held']")
            await expect(held).to_be_visible()
            await held.get_by_role("button", name="Edit arguments").click()
            await held.get_by_label("Arguments to run the call with (JSON)").fill('{\n  "command": "make report"\n}')
            await held.get_by_label("Why (sent to the model with a denial)").fill("keep the build directory")
            await held.scroll_into_view_if_needed()
            await page.screenshot(path=out / "console-approval-edit.png")

            await page.get_by_label("While a turn runs, what I send").select_option("enqueue")
            await page.get_by_label("Message").fill("Then mail it to the team")
            await page.get_by_label("Approvals").select_option("normal")
            await page.screenshot(path=out / "console-busy.png")
            await browser.close()
    print(f"screenshots in {out}")


if __name__ == "__main__":
    asyncio.run(take(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")))
