"""The console's memory blocks view (#/blocks) in real headless Chromium against the whole stack,
signed in with a token: the namespace's blocks and the signed-in person's own `user` block as the
agent wrote them in a real turn; a person edits one, reads its history with where each version
came from, reverts it; with the namespace's edits set to wait, the agent's next edits are listed
as drafts and one is approved, one rejected. Each change is read back through the HTTP API, and
axe-core finds no serious or critical violation."""

from __future__ import annotations

import httpx
import pytest

from agentmesh.v1 import gateway_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import collect
from tests.web.accessibility import screenshot, serious_violations
from tests.web.browser import needs_chromium
from tests.web.test_views import browser, open_console, view  # noqa: F401 - the browser fixture, shared

pytestmark = needs_chromium

playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect
TOKEN = "tok-console-blocks-0123456789"
BEARER = (("authorization", f"Bearer {TOKEN}"),)
NAME = "The user's name is Ada."
CALM = "This team prefers calm answers."


async def _turn(stack: Stack, session_id: str, message: str) -> None:
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id), metadata=BEARER, timeout=10)
    await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id=session_id, message=message), metadata=BEARER,
                               timeout=60))


async def test_blocks_are_shown_edited_reverted_and_drafts_decided(browser, tmp_path, llm):  # noqa: F811 - the fixture
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_TOKENS": TOKEN}) as stack:
        llm.add(reply("", tool_call("block_append", {"name": "user", "text": NAME})),
                reply("", tool_call("block_append", {"name": "project", "text": CALM})), reply("Noted."))
        await _turn(stack, "s1", "I'm Ada; keep answers calm.")

        page, errors = await open_console(browser, stack)
        await page.get_by_label("Bearer token").fill(TOKEN)
        await page.get_by_role("button", name="Sign in").click()
        await view(page, "Blocks", "Memory blocks")
        blocks = page.get_by_role("list", name="Blocks")
        await expect(blocks.locator("li[data-block]")).to_have_count(2)
        # The prompt's order: the person's own user block, then the namespace's project block.
        await expect(blocks.locator("li[data-block]").first.get_by_role("heading")).to_have_text("user (yours)")
        await expect(page.get_by_label("Text of user (yours)", exact=True)).to_have_text(NAME)
        await expect(page.get_by_label("Text of project", exact=True)).to_have_text(CALM)
        assert await serious_violations(page) == []

        # A person edits the project block: a new version, shown at once.
        await page.get_by_role("button", name="Edit project").click()
        await page.get_by_label("New text of project").fill("This team prefers short, calm answers.")
        await page.get_by_role("button", name="Save project").click()
        await expect(page.locator(".view-status")).to_have_text("Saved project.")
        await expect(page.get_by_label("Text of project", exact=True)).to_have_text("This team prefers short, calm answers.")
        # Its history: v2 by the person, v1 by the agent in session s1; revert to v1.
        await page.get_by_role("button", name="History of project").click()
        history = page.locator(".block-history")
        await expect(history.locator("li[data-version]")).to_have_count(2)
        await expect(history.locator("li[data-version='1']")).to_contain_text("append")
        await expect(history.locator("li[data-version='1']").get_by_role("link", name="s1")).to_be_visible()
        await expect(history.locator("li[data-version='2']")).to_contain_text("set")
        assert await serious_violations(page) == []
        await screenshot(page, "blocks")
        await page.get_by_role("button", name="Revert project to v1").click()
        await expect(page.locator(".view-status")).to_have_text("Reverted project to the text of v1.")
        await expect(page.get_by_label("Text of project", exact=True)).to_have_text(CALM)

        # Edits wait for a person: the agent's next two are drafts; one approved, one rejected.
        await page.get_by_label("The agent's edits").select_option("draft")
        await page.get_by_role("button", name="Set", exact=True).click()
        await expect(page.locator(".view-status")).to_have_text("The agent's edits now wait for a person.")
        llm.add(reply("", tool_call("block_append", {"name": "user", "text": "Ada prefers tea."})),
                reply("", tool_call("block_append", {"name": "user", "text": "Ada hates tea."})), reply("Noted."))
        await _turn(stack, "s2", "Tea, please.")
        await page.get_by_role("button", name="Show").click()
        waiting = page.get_by_role("table", name="Edits waiting")
        await expect(waiting.locator("tr[data-draft]")).to_have_count(2)
        await expect(waiting.locator("tr[data-draft]").first.get_by_role("link", name="s2")).to_be_visible()
        assert await serious_violations(page) == []
        await page.get_by_role("button", name="Approve the edit of user: Ada prefers tea.").click()
        await expect(page.locator(".view-status")).to_have_text("Approved the append of user.")
        reject = page.get_by_role("button", name="Reject the edit of user: Ada hates tea.")
        await reject.click()
        await expect(reject).to_have_text("Press again to reject")
        await reject.click()
        await expect(page.locator(".view-status")).to_have_text("Rejected the append of user.")
        await expect(page.get_by_role("table", name="Edits waiting")).to_have_count(0)
        await expect(page.get_by_label("Text of user (yours)", exact=True)).to_have_text(f"{NAME}\nAda prefers tea.")

        async with httpx.AsyncClient(base_url=stack.http_url, headers={"authorization": f"Bearer {TOKEN}"}) as http:
            listed = (await http.get("/v1/namespaces/default/blocks")).json()
            project = (await http.get("/v1/namespaces/default/blocks/project")).json()
        assert {b["name"]: b["text"] for b in listed["blocks"]} == {"user": f"{NAME}\nAda prefers tea.", "project": CALM}
        assert listed["edits"] == "draft" and listed.get("drafts", []) == []
        assert [(v["version"], v["change"]) for v in project["versions"]] == [("3", "revert"), ("2", "set"), ("1", "append")]
        errors.assert_none(allowed=("401",))  # the calls before signing in
