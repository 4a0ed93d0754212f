"""Screenshots of the console's main screens for docs/images/, taken in headless Chromium from a
real stack with a scripted model:

    .venv/bin/python -m tests.web.screenshots docs/images
"""

from __future__ import annotations

import asyncio
import base64
import sys
import tempfile
from pathlib import Path

import httpx
from playwright.async_api import async_playwright, expect

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2, gateway_pb2, sessions_pb2
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack
from tests.web.browser import TIMEOUT_MS, launch

WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 780}
TOKEN = "docs-token-0123456789"


async def take(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    expect.set_options(timeout=TIMEOUT_MS)
    with ScriptedLLMServer() as llm, tempfile.TemporaryDirectory() as home:
        env = {"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell", "AGENTMESH_AUTH_TOKENS": TOKEN}
        async with Stack(Path(home), llm_base_url=llm.base_url, env=env) as stack, async_playwright() as playwright:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            metadata = (("authorization", f"Bearer {TOKEN}"),)
            gateway, memory = stack.gateway_stub(), stack.memory_stub()
            # An older session with a summary and a sub-agent, for the sidebar and history.
            await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="q3-planning", title="Q3 planning"),
                                        timeout=10, metadata=metadata)
            await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="release-notes", title="Release notes 0.2"),
                                        timeout=10, metadata=metadata)
            llm.add(reply("", tool_call("write_file", {"path": "plan.md", "content": "# Q3 plan\n- ship the console\n"})),
                    reply("I wrote the plan to plan.md."))
            async for _ in gateway.Chat(gateway_pb2.ChatRequest(session_id="q3-planning", message="Draft the Q3 plan in plan.md"),
                                        timeout=60, metadata=metadata):
                pass
            await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(session_id="q3-planning", messages=[
                common_pb2.Message(role="system", kind="summary", covers_through_seq=4,
                                   content="The user asked for a Q3 plan; plan.md holds it.")]), timeout=10)
            await memory.PutSession(memory_service_pb2.PutSessionRequest(session=sessions_pb2.Session(
                session_id="q3-planning.sub-1a2b", title="sub-agent: research competitors",
                labels={"parent_session": "q3-planning", "role": "sub-agent"})), timeout=10)
            async with httpx.AsyncClient(base_url=stack.http_url, headers=auth) as http:
                await http.put("/v1/sessions/q3-planning/workspace/file", json={
                    "path": "data/metrics.csv", "content": base64.b64encode(b"week,turns,p50_ms\n1,1200,410\n2,1530,395\n").decode()})

            browser = await launch(playwright)
            page = await (await browser.new_context(viewport=WIDE, color_scheme="light")).new_page()
            await page.goto(stack.http_url + "/")
            await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
            await page.screenshot(path=out / "console-sign-in.png")
            await page.get_by_label("Bearer token").fill(TOKEN)
            await page.get_by_role("button", name="Sign in").click()

            # A chat: streamed text, a tool card, a held call waiting for approval.
            llm.add(
                reply("I'll count the lines of the metrics file first.",
                      tool_call("read_file", {"path": "data/metrics.csv"}, id="r1")),
                reply("", tool_call("shell", {"command": "wc -l data/metrics.csv"}, id="s1")),
                reply("The metrics file has 3 lines: a header and two weeks of numbers. "
                      "Turns grew 27% while the median latency fell from 410 to 395 ms.", usage=(812, 64)),
            )
            await page.locator("button.session", has_text="Q3 planning").click()
            await page.get_by_label("Message").fill("How many lines does data/metrics.csv have?")
            await page.get_by_label("Message").press("Enter")
            held = page.locator(".tool-card[data-state='held']")
            await expect(held).to_be_visible()
            await held.scroll_into_view_if_needed()
            await page.screenshot(path=out / "console-approval.png")
            await held.get_by_role("button", name="Approve", exact=True).click()
            await expect(page.locator(".turn-footer .usage")).to_contain_text("tokens")
            await page.locator(".tool-card", has_text="shell").locator("summary").click()
            await page.locator(".turn-footer").scroll_into_view_if_needed()
            await page.screenshot(path=out / "console-chat.png")

            for host in stack.hosts.values():
                host.telemetry.force_flush()
            await page.get_by_role("button", name="Trace", exact=True).click()
            await expect(page.get_by_role("table")).to_contain_text("invoke_agent")
            await page.screenshot(path=out / "console-trace.png")

            await page.get_by_role("tab", name="Workspace").click()
            await page.get_by_role("button", name="data/").click()
            await page.get_by_role("button", name="metrics.csv").click()
            await expect(page.locator("#viewer")).to_contain_text("week,turns")
            await page.screenshot(path=out / "console-workspace.png")

            narrow = await (await browser.new_context(viewport=NARROW, color_scheme="dark")).new_page()
            await narrow.goto(stack.http_url + "/")
            await narrow.get_by_label("Bearer token").fill(TOKEN)
            await narrow.get_by_role("button", name="Sign in").click()
            await narrow.get_by_role("button", name="Sessions").click()
            await narrow.locator("button.session", has_text="Q3 planning").click()
            await expect(narrow.locator(".summary-card")).to_be_visible()
            await narrow.screenshot(path=out / "console-narrow.png")
            await browser.close()
    print(f"screenshots in {out}")


if __name__ == "__main__":
    asyncio.run(take(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images")))
