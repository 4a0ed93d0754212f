"""The console's views over what is stored — usage, activity, skills, memory, scheduled jobs, a
session's task board — and the dev panel, in real headless Chromium against the whole stack. The
data is made through the API first; each view shows it, its actions change it, and axe-core finds
no serious or critical violation on any of them (nor on the chat)."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from google.protobuf import struct_pb2

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import gateway_pb2
from tests.support.llm_server import reply, tool_call
from tests.web.accessibility import focus_by_keyboard, screenshot, serious_violations
from tests.web.browser import TIMEOUT_MS, PageErrors, launch, needs_chromium

pytestmark = needs_chromium

playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect
expect.set_options(timeout=TIMEOUT_MS)
WIDE = {"width": 1280, "height": 860}


@pytest.fixture
async def browser():
    async with playwright_api.async_playwright() as playwright:
        chromium = await launch(playwright)
        yield chromium
        await chromium.close()


async def open_console(browser, stack, path: str = "/"):
    page = await (await browser.new_context(viewport=WIDE)).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors = PageErrors(page)
    await page.goto(stack.http_url + path)
    return page, errors


async def view(page, link: str, heading: str):
    await page.get_by_role("navigation", name="Console views").get_by_role("link", name=link, exact=True).click()
    await expect(page.get_by_role("heading", name=heading, level=2)).to_be_visible()
    await expect(page.get_by_role("heading", name=heading, level=2)).to_be_focused()


async def test_usage_activity_and_the_dev_panel_show_a_real_turn(browser, stack, llm):
    llm.add(reply("Let me write it down.", tool_call("write_file", {"path": "notes.txt", "content": "agentmesh"}, id="w1"),
                  usage=(300, 20)),
            reply("Saved the note.", usage=(812, 64)))
    page, errors = await open_console(browser, stack)
    await page.get_by_label("Message").fill("Please write a note")
    await page.get_by_label("Message").press("Enter")
    await expect(page.locator(".turn .bubble.assistant .text").last).to_have_text("Saved the note.")
    session_id = page.url.rsplit("/", 1)[1]
    assert await serious_violations(page) == []

    await view(page, "Usage", "Usage")
    await expect(page.get_by_role("status").filter(has_text="model calls")).to_have_text(
        "1,196 tokens in 2 model calls · cost —")
    await expect(page.get_by_role("img", name="Tokens by day.")).to_have_attribute("aria-label", re.compile(r"^Tokens by day\. \d{4}-\d\d-\d\d: 1,196 tokens$"))
    by_session = page.get_by_role("table", name="Usage by session")
    await expect(by_session.get_by_role("row").nth(1)).to_contain_text(session_id)
    await expect(by_session.get_by_role("row").nth(1)).to_contain_text("1,112")  # input tokens: 300 + 812
    await expect(page.get_by_role("table", name="Usage by model").get_by_role("row")).to_have_count(2)
    assert await serious_violations(page) == []
    await screenshot(page, "usage")

    await view(page, "Activity", "Activity")
    runs = page.get_by_role("table", name="Recent runs")
    await expect(runs.get_by_role("row").nth(1)).to_contain_text(session_id)
    await expect(runs.get_by_role("row").nth(1)).to_contain_text("succeeded")
    await expect(page.get_by_role("status").filter(has_text="watching")).to_be_visible()
    # A turn started elsewhere (the API) while the view is open shows live.
    llm.add(reply("", tool_call("write_file", {"path": "live.txt", "content": "live"}, id="l1")), reply("Live done."))
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=60) as http:
        await http.post("/v1/sessions", json={"session_id": "live-work", "title": "Live work"})
        chat = asyncio.ensure_future(http.post("/v1/sessions/live-work/chat", json={"message": "go"}))
        live = page.get_by_role("log", name="Live activity")
        await expect(live.locator("[data-kind='run_started']")).to_contain_text("live-work")
        await expect(live.locator("[data-kind='tool_call']")).to_contain_text("write_file")
        await expect(live.locator("[data-kind='run_finished']")).to_contain_text("live-work")
        assert (await chat).status_code == 200
    assert await serious_violations(page) == []
    await screenshot(page, "activity")

    # A run started elsewhere: its events from the start, in the dev panel (JoinRun).
    await view(page, "Usage", "Usage")
    await view(page, "Activity", "Activity")
    live_run = page.get_by_role("table", name="Recent runs")
    live_row = live_run.get_by_role("row").filter(has_text="live-work")
    await expect(live_row).to_have_count(1)
    live_id = await live_row.get_attribute("data-run")
    await live_run.get_by_role("link", name=f"Events of {live_id}").click()
    await expect(page.get_by_role("heading", name="Dev panel", level=2)).to_be_visible()
    await expect(page.get_by_label("Session", exact=True)).to_have_value("live-work")
    joined = page.get_by_role("list", name="Events")
    await expect(joined.locator("[data-type='run_started']")).to_have_count(1)
    await expect(joined.locator("[data-type='tool_call']")).to_contain_text("live-work")
    await expect(joined.locator("[data-type='run_finished']")).to_have_count(1)
    assert page.url.endswith(f"#/dev/{live_id}")

    await view(page, "Dev panel", "Dev panel")
    await page.get_by_label("Session", exact=True).select_option(session_id)
    events = page.get_by_role("list", name="Events")
    for kind in ("run_started", "text_delta", "tool_call", "tool_result", "run_finished"):
        await expect(events.locator(f"[data-type='{kind}']").first).to_be_visible()
    call = events.locator("[data-type='tool_call']")
    await call.locator("summary").click()
    await expect(call.locator(".dev-payload")).to_contain_text('"name": "write_file"')
    await page.get_by_label("text_delta", exact=False).uncheck()
    await expect(events.locator("[data-type='text_delta']")).to_have_count(0)
    await expect(events.locator("[data-type='tool_call']")).to_have_count(1)
    assert await serious_violations(page) == []
    await screenshot(page, "dev-panel")

    # Back to the chat (still drawn, not reloaded), its turn's trace, and from there the run's events.
    await page.get_by_role("navigation", name="Console views").get_by_role("link", name="Chat", exact=True).click()
    await expect(page.locator(".turn .bubble.assistant .text").last).to_have_text("Saved the note.")
    for host in stack.hosts.values():
        host.telemetry.force_flush()
    await page.get_by_role("button", name="Trace", exact=True).click()
    to_events = page.get_by_role("link", name=re.compile(r"^Every event of run-\w+ in the dev panel$"))
    await to_events.click()
    await expect(page.get_by_role("heading", name="Dev panel", level=2)).to_be_visible()
    await expect(page.get_by_label("Session", exact=True)).to_have_value(session_id)
    await expect(page.get_by_role("list", name="Events").locator("[data-type='run_finished']")).to_have_count(1)
    errors.assert_none()


def _skill(name: str, body: str) -> list[dict]:
    return [{"path": "SKILL.md", "content": f"---\nname: {name}\ndescription: {body}\n---\nRun the script on {name}.\n"}]


async def test_skills_and_memory_are_decided_searched_and_forgotten(browser, stack):
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        await http.post("/v1/namespaces/default/skills", json={"files": _skill("csv-stats", "Column counts of a CSV file.")})
        await http.post("/v1/namespaces/default/skills", json={"files": _skill("csv-stats", "Column counts and sums."), "draft": True,
                                                                "source": "reflection:q3"})
        await http.post("/v1/namespaces/default/skills", json={"files": _skill("weekly-report", "The Friday report."), "draft": True})
    memory = stack.memory_stub()
    metadata = struct_pb2.Struct()
    metadata.update({"origin": "reflection", "run": "run-17"})
    kept = await memory.Remember(memory_service_pb2.RememberRequest(
        namespace="default", text="The staging database is called ledger-stg.", kind="fact", metadata=metadata,
        source_session_id="q3-planning"), timeout=10)
    await memory.Remember(memory_service_pb2.RememberRequest(
        namespace="default", text="The user prefers metric units.", kind="preference"), timeout=10)

    page, errors = await open_console(browser, stack, "/#/skills")  # deep-linked
    await expect(page.get_by_role("heading", name="Skills", level=2)).to_be_visible()
    skills = page.get_by_role("table", name="Skills")
    await expect(skills.locator("tr[data-status='draft']")).to_have_count(2)
    await page.get_by_role("button", name="Versions of csv-stats").first.click()
    detail = page.locator(".skill-detail")
    await expect(detail.locator(".versions li")).to_have_count(2)
    await expect(detail.locator(".versions")).to_contain_text("v2 · draft")
    await expect(detail.locator(".skill-body")).to_contain_text("Run the script on csv-stats.")
    await screenshot(page, "skills")
    # Rejecting takes two presses; the active version stays.
    reject = page.get_by_role("button", name="Reject csv-stats v2")
    await reject.click()
    await expect(reject).to_have_text("Press again to reject")
    await reject.click()
    await expect(page.locator(".view-status")).to_contain_text("Rejected csv-stats v2")
    await expect(skills.locator("tr[data-skill='csv-stats']")).to_have_count(1)
    await expect(skills.locator("tr[data-skill='csv-stats']")).to_contain_text("active")
    # Approving by keyboard alone: Tab reaches the button, its focus is drawn, Enter presses it.
    await focus_by_keyboard(page, "Approve weekly-report v1")
    await page.keyboard.press("Enter")
    await expect(page.locator(".view-status")).to_contain_text("Approved weekly-report v1")
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        listed = (await http.get("/v1/namespaces/default/skills", params={"include_drafts": "true"})).json()["skills"]
    assert sorted((s["name"], s["version"], s["status"]) for s in listed) == [
        ("csv-stats", "1", "active"), ("weekly-report", "1", "active")]
    assert await serious_violations(page) == []

    await view(page, "Memory", "Memory")
    memories = page.get_by_role("list", name="Memories")
    await expect(memories.locator(".memory")).to_have_count(2)
    await page.get_by_label("Search").fill("staging database name")
    await page.get_by_role("button", name="Show").click()
    await expect(memories.locator(".memory").first).to_contain_text("ledger-stg")
    await memories.locator(f"[data-memory='{kept.id}']").get_by_role("button", name="Provenance", exact=False).click()
    provenance = memories.locator(f"[data-memory='{kept.id}'] .provenance")
    await expect(provenance.get_by_role("link", name="q3-planning")).to_be_visible()
    await expect(provenance).to_contain_text('"run": "run-17"')
    await screenshot(page, "memory")
    assert await serious_violations(page) == []
    await page.get_by_label("Search").fill("")
    await page.get_by_role("button", name="Show").click()
    forget = page.get_by_role("button", name="Forget: The user prefers metric units.")
    await forget.click()
    await forget.click()
    await expect(page.locator(".view-status")).to_have_text("Forgotten: “The user prefers metric units.”")
    await expect(memories.locator(".memory")).to_have_count(1)
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        left = (await http.get("/v1/namespaces/default/memories")).json()["memories"]
    assert [m["id"] for m in left] == [kept.id]
    errors.assert_none()


async def test_jobs_are_created_paused_and_run_and_a_task_board_is_shown(browser, stack, llm):
    llm.add(reply("", tool_call("task_create", {"subject": "fetch data"}, id="t1"),
                  tool_call("task_create", {"subject": "clean data", "blocked_by": [1]}, id="t2")),
            reply("", tool_call("task_create", {"subject": "write report", "description": "a table", "blocked_by": [2]}, id="t3"),
                  tool_call("task_update", {"id": 1, "status": "done"}, id="t4")),
            reply("Planned."))
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="planning", title="Planning"), timeout=10)
    async for _ in gateway.Chat(gateway_pb2.ChatRequest(session_id="planning", message="plan the report"), timeout=60):
        pass

    page, errors = await open_console(browser, stack, "/#/tasks/planning")
    await expect(page.get_by_role("heading", name="Task board", level=2)).to_be_visible()
    await expect(page.locator(".view-status")).to_have_text("3 tasks, 2 open")
    await expect(page.get_by_role("region", name="Done (1)")).to_contain_text("#1 fetch data")
    todo = page.get_by_role("region", name="To do (2)")
    await expect(todo.locator("[data-task='2']")).not_to_contain_text("waits for")
    await expect(todo.locator("[data-task='3']")).to_contain_text("waits for #2")
    await expect(page.get_by_label("Session", exact=True)).to_have_value("planning")
    assert await serious_violations(page) == []
    await screenshot(page, "tasks")

    await view(page, "Jobs", "Scheduled jobs")
    await expect(page.locator(".view-status")).to_have_text("0 jobs")
    await page.get_by_label("Name", exact=True).fill("nightly report")
    await page.get_by_label("Schedule", exact=True).fill("daily 23:00")
    await page.get_by_label("Prompt", exact=True).fill("Summarise the day")
    await page.get_by_role("button", name="Create job").click()
    jobs = page.get_by_role("table", name="Jobs")
    await expect(jobs.get_by_role("row").nth(1)).to_contain_text("nightly report")
    await expect(jobs.get_by_role("row").nth(1)).to_contain_text("enabled")
    await page.get_by_role("button", name="Pause nightly report").click()
    await expect(jobs.get_by_role("row").nth(1)).to_contain_text("paused")
    llm.add(reply("Today: one plan, three tasks."))
    await page.get_by_role("button", name="Run nightly report now").click()
    await expect(page.locator(".view-status")).to_contain_text("Started run")
    history = page.get_by_role("button", name="History of nightly report")
    for _ in range(60):  # the run ends on its own: read the history again until it says so
        await history.click()
        runs = page.get_by_role("table", name="Runs of nightly report")
        await expect(runs).to_be_visible()
        if "succeeded" in await runs.inner_text():
            break
        await asyncio.sleep(0.5)
    await expect(runs.get_by_role("row").nth(1)).to_contain_text("manual")
    await expect(runs.get_by_role("row").nth(1)).to_contain_text("succeeded")
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        (job,) = (await http.get("/v1/cron/jobs")).json()["jobs"]
    assert (job["name"], job["enabled"]) == ("nightly report", False)
    assert await serious_violations(page) == []
    await screenshot(page, "jobs")
    errors.assert_none()
