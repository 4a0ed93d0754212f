"""The dev panel shows each model call's request and response, in real headless Chromium against
the whole stack with AGENTMESH_AGENT_RECORD_MODEL_CALLS on: reached from a model-call span of the
turn's trace waterfall, each call lists the request's messages, tools and parameters and the
response's text, tool calls and usage — with no key in any of it."""

from __future__ import annotations

import json

import pytest

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import collect, of_kind
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.web.accessibility import serious_violations
from tests.web.browser import needs_chromium
from tests.web.test_views import browser, expect, open_console, view  # noqa: F401 - the browser fixture

pytestmark = needs_chromium


@pytest.fixture
async def recording(tmp_path, llm):
    env = {"AGENTMESH_AGENT_RECORD_MODEL_CALLS": "true", "AGENTMESH_AGENT_RECALL_K": "0"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def test_the_dev_panel_shows_a_calls_request_and_response(browser, recording, llm):  # noqa: F811 - the fixture
    llm.add(reply("Let me write it down.", tool_call("write_file", {"path": "notes.txt", "content": "agentmesh"}, id="w1"),
                  usage=(300, 20)),
            reply("Saved the note.", usage=(812, 64)))
    page, errors = await open_console(browser, recording)
    await page.get_by_label("Message").fill("Please write a note")
    await page.get_by_label("Message").press("Enter")
    await expect(page.locator(".turn .bubble.assistant .text").last).to_have_text("Saved the note.")
    for host in recording.hosts.values():
        host.telemetry.force_flush()
    await page.get_by_role("button", name="Trace", exact=True).click()
    await page.get_by_role("link", name="request and response").first.click()

    await expect(page.get_by_role("heading", name="Dev panel", level=2)).to_be_visible()
    calls = page.get_by_role("list", name="Model calls")
    await expect(calls.locator(".dev-call")).to_have_count(2)
    first = calls.locator("[data-call='1']")
    await expect(first.locator("summary")).to_contain_text("300 in, 20 out")
    await first.locator("summary").click()
    sent = first.get_by_role("list", name="Request messages of call 1")
    await expect(sent.locator("[data-role='user']")).to_contain_text("Please write a note")
    await expect(first.locator(".dev-tools")).to_contain_text("write_file")
    await expect(first.locator(".dev-parameters")).to_contain_text('"allow_tools": true')
    await expect(first.locator(".dev-response")).to_contain_text('"name": "write_file"')
    second = calls.locator("[data-call='2']")
    await second.locator("summary").click()
    await expect(second.get_by_role("list", name="Request messages of call 2").locator("[data-role='tool']")).to_have_count(1)
    await expect(second.locator(".dev-response")).to_contain_text('"text": "Saved the note."')
    assert "sk-test-secret-key" not in await page.content()
    assert await serious_violations(page) == []
    # The panel of this tab's events (no run loaded) lists no run's calls.
    await view(page, "Dev panel", "Dev panel")
    await expect(page.get_by_role("list", name="Events").locator("[data-type='run_finished']")).to_have_count(1)
    await expect(page.get_by_role("list", name="Model calls")).to_have_count(0)
    errors.assert_none()


async def test_the_dev_panel_turns_recording_on_for_one_session(browser, stack, llm):  # noqa: F811 - the fixture
    """Without the deployment's setting, the dev panel's switch turns one session's recording on
    (UpdateSession's record_model_calls): that session's next turn has its call recorded and
    listed in the panel, another session's turn has none."""
    gateway = stack.gateway_stub()
    for session_id, title in (("rec-on", "Recorded"), ("rec-off", "Not recorded")):
        await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id, title=title), timeout=10)
    page, errors = await open_console(browser, stack)
    await view(page, "Dev panel", "Dev panel")
    await page.get_by_label("Session to record").select_option("rec-on")
    switch = page.get_by_label("Record this session's model calls")
    await expect(switch).not_to_be_checked()
    await switch.check()
    await expect(page.locator("#dev-record-status")).to_contain_text("record each model call")
    assert await serious_violations(page) == []

    for session_id in ("rec-on", "rec-off"):
        llm.add(reply(f"answer in {session_id}"))
        events = await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id=session_id, message="hi"), timeout=60))
        assert of_kind(events, "run_finished")
    recorded = (await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="rec-on"), timeout=10)).calls
    assert [json.loads(c.response_json)["text"] for c in recorded] == ["answer in rec-on"]
    assert not (await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="rec-off"), timeout=10)).calls

    await page.goto(f"{stack.http_url}/#/dev/{recorded[0].run_id}")
    await expect(page.get_by_role("list", name="Model calls").locator(".dev-call")).to_have_count(1)
    # Reopened, the switch shows each session's own setting.
    await page.get_by_label("Session to record").select_option("rec-off")
    await expect(page.get_by_label("Record this session's model calls")).not_to_be_checked()
    await page.get_by_label("Session to record").select_option("rec-on")
    await expect(page.get_by_label("Record this session's model calls")).to_be_checked()
    errors.assert_none()
