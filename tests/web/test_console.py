"""The web console in real headless Chromium, against the whole stack over real HTTP."""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2, gateway_pb2, sessions_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.web.browser import TIMEOUT_MS, PageErrors, launch, needs_chromium

pytestmark = needs_chromium

playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect
expect.set_options(timeout=TIMEOUT_MS)
TOKEN = "console-token-0123456789"


@pytest.fixture
async def browser():
    async with playwright_api.async_playwright() as playwright:
        chromium = await launch(playwright)
        yield chromium
        await chromium.close()


async def open_console(browser, stack, **context):
    page = await (await browser.new_context(**context)).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors = PageErrors(page)
    await page.goto(stack.http_url + "/")
    return page, errors


async def send(page, text: str) -> None:
    await page.get_by_label("Message").fill(text)
    await page.get_by_label("Message").press("Enter")


async def test_a_message_streams_its_answer_with_a_tool_card(browser, stack, llm):
    llm.add(
        reply("Let me write it down.", tool_call("write_file", {"path": "notes.txt", "content": "agentmesh"}, id="w1")),
        reply("Saved the note to notes.txt for you.", chunk_chars=4, pause_after_chunks=3, pause_s=1.5, usage=(120, 30)),
    )
    page, errors = await open_console(browser, stack)
    await send(page, "Please write a note")

    answer = page.locator(".turn .bubble.assistant .text").last
    # Streamed: part of the answer shows while the turn still runs (Cancel is offered).
    await expect(answer).to_have_text("Saved th")
    await expect(page.get_by_role("button", name="Cancel")).to_be_visible()
    await expect(answer).to_have_text("Saved the note to notes.txt for you.")
    await expect(page.get_by_role("button", name="Cancel")).to_be_hidden()

    card = page.locator(".tool-card", has_text="write_file")
    await expect(card).to_have_attribute("data-state", "ok")
    await expect(card.locator(".tool-status")).to_contain_text("ms")
    await card.locator("summary").click()
    await expect(card.locator(".tool-output")).to_contain_text("notes.txt")
    await expect(card.locator(".tool-args")).to_contain_text('"content": "agentmesh"')
    await expect(page.locator(".turn-footer .usage")).to_contain_text("tokens")
    # The new session is listed and selected.
    await expect(page.locator("button.session[aria-current='page']")).to_contain_text("Please write a note")
    errors.assert_none()


async def test_a_held_call_is_approved_from_the_console(browser, tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}) as stack:
        llm.add(reply("", tool_call("shell", {"command": "echo approved > ok.txt"}, id="s1")), reply("It ran."))
        page, errors = await open_console(browser, stack)
        await send(page, "run the command")
        card = page.locator(".tool-card", has_text="shell")
        await expect(card).to_have_attribute("data-state", "held")
        await expect(card.get_by_text("The agent wants to run shell.")).to_be_visible()
        assert not list((stack.settings.home / "workspaces").glob("*/ok.txt"))  # nothing ran yet
        await card.get_by_role("button", name="Approve", exact=True).click()
        await expect(card).to_have_attribute("data-state", "ok")
        await expect(card.locator(".tool-status")).to_contain_text("exit 0")
        await expect(card).to_contain_text("Approved (by you)")
        await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("It ran.")
        assert [p.read_text() for p in (stack.settings.home / "workspaces").glob("*/ok.txt")] == ["approved\n"]
        errors.assert_none()


async def test_an_older_session_opens_with_its_full_history(browser, stack, llm):
    gateway, memory = stack.gateway_stub(), stack.memory_stub()
    llm.add(reply("", tool_call("write_file", {"path": "a.txt", "content": "A"}, id="c1")), reply("First answer."))
    async for _ in gateway.Chat(gateway_pb2.ChatRequest(session_id="older", message="first question"), timeout=60):
        pass
    summary = common_pb2.Message(role="system", kind="summary", content="The user asked for a.txt; it was written.",
                                 covers_through_seq=4)
    await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(session_id="older", messages=[summary]), timeout=10)
    child = sessions_pb2.Session(session_id="older.sub-1", title="research helper", labels={"parent_session": "older", "role": "sub-agent"})
    await memory.PutSession(memory_service_pb2.PutSessionRequest(session=child), timeout=10)
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="newer", title="Another one"), timeout=10)

    page, errors = await open_console(browser, stack)
    await page.locator("button.session", has_text="older").first.click()
    log = page.get_by_role("log", name="Conversation")
    await expect(log.locator(".bubble.user")).to_have_text(["Youfirst question"])
    await expect(log.locator(".bubble.assistant").last).to_contain_text("First answer.")
    await expect(log.locator(".tool-card", has_text="write_file")).to_be_visible()
    await log.locator(".tool-card summary").click()
    await expect(log.locator(".tool-output")).to_contain_text("a.txt")
    summary_card = log.locator(".summary-card")
    await expect(summary_card).to_contain_text("Summary of earlier messages (through #4)")
    await summary_card.locator("summary").click()
    await expect(summary_card).to_contain_text("it was written")

    await page.locator("#subagents").get_by_role("button", name="research helper").click()
    await expect(page.locator("#session-title")).to_have_text("research helper")
    await expect(page.locator("#subagents")).to_contain_text("Sub-agent of older")
    assert page.url.endswith("#/sessions/older.sub-1")
    errors.assert_none()


async def test_the_workspace_is_browsed_and_a_file_uploaded(browser, stack):
    async with httpx.AsyncClient(base_url=stack.http_url) as http:
        await http.post("/v1/sessions", json={"session_id": "files", "title": "Files"})
        await http.put("/v1/sessions/files/workspace/file", json={"path": "reports/summary.md", "content": "IyBSZXBvcnQKQWxsIGdvb2Qu"})

    page, errors = await open_console(browser, stack)
    await page.goto(stack.http_url + "/#/sessions/files")
    await page.get_by_role("tab", name="Workspace").click()
    await page.get_by_role("button", name="reports/").click()
    await page.get_by_role("button", name="summary.md").click()
    await expect(page.locator("#viewer")).to_have_text("# Report\nAll good.")

    await page.get_by_label("Upload a file into this folder").set_input_files(
        files=[{"name": "data.csv", "mimeType": "text/csv", "buffer": b"a,b\n1,2\n"}]
    )
    await page.get_by_role("button", name="Upload", exact=True).click()
    await expect(page.locator("#upload-status")).to_have_text("Uploaded reports/data.csv (8 B).")
    await page.get_by_role("button", name="data.csv").click()
    await expect(page.locator("#viewer")).to_have_text("a,b\n1,2\n")
    assert (stack.settings.home / "workspaces" / "files" / "reports" / "data.csv").read_bytes() == b"a,b\n1,2\n"
    errors.assert_none()


async def test_a_turn_trace_is_drawn_as_a_waterfall(browser, stack, llm):
    llm.add(reply("", tool_call("write_file", {"path": "t.txt", "content": "t"})), reply("Traced."))
    page, errors = await open_console(browser, stack)
    await send(page, "trace this")
    await expect(page.get_by_role("button", name="Trace", exact=True)).to_be_visible()
    for host in stack.hosts.values():
        host.telemetry.force_flush()
    await page.get_by_role("button", name="Trace", exact=True).click()
    waterfall = page.get_by_role("table")
    await expect(waterfall.locator(".span-row").first).to_contain_text("POST /v1/sessions/{session_id}/chat")
    await expect(waterfall).to_contain_text("invoke_agent")
    await expect(waterfall).to_contain_text("execute_tool write_file")
    await expect(page.locator("#trace-status")).to_contain_text("spans")
    errors.assert_none()


async def test_a_running_turn_is_cancelled(browser, stack, llm):
    llm.add(reply("This will take a while", chunk_chars=2, pause_after_chunks=3, pause_s=5))
    page, errors = await open_console(browser, stack)
    await send(page, "take your time")
    # The reply stalls after "This"; its last characters may be held back while they could
    # begin a configured model key (providers/redaction.py), so the bubble shows "Thi" or "This".
    await expect(page.locator(".turn .bubble.assistant .text")).to_have_text(re.compile(r"^Thi"))
    await page.get_by_role("button", name="Cancel").click()
    await expect(page.locator(".turn .note")).to_have_text("Stopped: cancelled")
    errors.assert_none()


async def test_a_session_is_deleted_after_a_second_press(browser, stack):
    await stack.gateway_stub().CreateSession(gateway_pb2.CreateSessionRequest(session_id="doomed", title="Doomed"), timeout=10)
    page, errors = await open_console(browser, stack)
    await page.locator("button.session", has_text="Doomed").click()
    delete = page.locator("#delete-session")
    await delete.click()
    await expect(delete).to_have_text("Press again to delete")
    await expect(page.locator("button.session", has_text="Doomed")).to_be_visible()
    await delete.click()
    await expect(page.locator("button.session", has_text="Doomed")).to_have_count(0)
    errors.assert_none()


async def test_nothing_is_shown_without_the_token(browser, tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AUTH_TOKENS": TOKEN}) as stack:
        await stack.gateway_stub().CreateSession(
            gateway_pb2.CreateSessionRequest(session_id="private", title="Private plans"), timeout=10,
            metadata=(("authorization", f"Bearer {TOKEN}"),),
        )
        page, errors = await open_console(browser, stack)
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        await expect(page.locator("#app")).to_be_hidden()
        assert "Private plans" not in await page.content()

        await page.get_by_label("Bearer token").fill("wrong")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("alert")).to_have_text("That token was not accepted.")
        await expect(page.locator("#app")).to_be_hidden()

        await page.get_by_label("Bearer token").fill(TOKEN)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("button.session", has_text="Private plans")).to_be_visible()
        await page.get_by_role("button", name="Sign out").click()
        await expect(page.locator("#app")).to_be_hidden()
        # The refused calls are the only console messages.
        errors.assert_none(allowed=("401",))


async def test_the_console_works_on_a_narrow_screen_with_labelled_controls(browser, stack):
    await stack.gateway_stub().CreateSession(gateway_pb2.CreateSessionRequest(session_id="phone", title="On the phone"), timeout=10)
    page, errors = await open_console(browser, stack, viewport={"width": 390, "height": 800})
    sessions = page.locator("button.session", has_text="On the phone")
    await expect(sessions).to_be_hidden()
    toggle = page.get_by_role("button", name="Sessions")
    await toggle.click()
    await expect(toggle).to_have_attribute("aria-expanded", "true")
    await sessions.click()
    await expect(page.locator("#session-title")).to_have_text("On the phone")
    await expect(sessions).to_be_hidden()  # the list closes once a session is open
    # Nothing wider than the screen.
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    # Every form control has a label a screen reader can read.
    unlabelled = await page.evaluate(
        """[...document.querySelectorAll('input, textarea, select')]
             .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.id)"""
    )
    assert unlabelled == []
    # Tabs move with the arrow keys.
    await page.get_by_role("tab", name="Chat").focus()
    await page.keyboard.press("ArrowRight")
    await expect(page.get_by_role("tab", name="Workspace")).to_be_focused()
    await expect(page.get_by_role("tabpanel")).to_have_attribute("id", "panel-workspace")
    errors.assert_none()


def deep_model(request):
    """A deep turn: a plan, a delegate_task to a sub-agent that writes a file, then the answer."""
    last = request.messages[-1]
    if last["role"] == "system" and "numbered plan" in last["content"]:
        return reply("1. have a sub-agent write report.txt\n2. answer")
    results = [m["content"] for m in request.messages if m["role"] == "tool"]
    if "You are a sub-agent" in request.messages[0]["content"]:
        if not results:
            return reply("", tool_call("write_file", {"path": "report.txt", "content": "from the sub-agent\n"}))
        return reply("I wrote report.txt.")
    if not results:
        return reply("Delegating.", tool_call("delegate_task", {"task": "Write report.txt."}, id="call_delegate"))
    return reply("The sub-agent wrote report.txt.")


async def test_deep_work_shows_its_progress_and_links_the_sub_agent(browser, tmp_path):
    from tests.support.llm_server import ScriptedLLMServer

    with ScriptedLLMServer(default=deep_model) as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
            page, errors = await open_console(browser, stack)
            await page.get_by_label("Deep mode").check()
            await send(page, "Have a report written")
            await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("The sub-agent wrote report.txt.")
            progress = page.locator(".progress-card")
            await expect(progress).to_contain_text("plan ready (2 steps)")
            # The plan itself, read from the transcript it was written to.
            await expect(progress.get_by_label("The agent's plan")).to_have_text("Plan:\n1. have a sub-agent write report.txt\n2. answer")
            await expect(progress.locator("progress")).to_be_visible()
            # The sub-agent's start and end, each a line of its own.
            await expect(progress.locator("li.subagent[data-state=started]")).to_have_text(
                "sub-agent 1 started: Write report.txt.")
            await expect(progress.locator("li.subagent[data-state=finished]")).to_contain_text(
                re.compile(r"^sub-agent 1 finished \(completed\): 2 model call\(s\), [1-9]\d* tokens$"))
            card = page.locator(".tool-card", has_text="delegate_task")
            await expect(card).to_have_attribute("data-state", "ok")
            await card.locator("summary").click()
            await card.get_by_role("button", name=re.compile("Open the sub-agent's session")).click()
            await expect(page.locator("#subagents")).to_contain_text("Sub-agent of")
            await expect(page.get_by_role("log", name="Conversation").locator(".tool-card", has_text="write_file")).to_be_visible()
            errors.assert_none()


async def test_a_reload_during_a_turn_follows_it_live(browser, stack, llm):
    from tests.web.conftest import stream

    llm.add(reply("", tool_call("write_file", {"path": "a.txt", "content": "a"}, id="w1")),
            reply("Finished after the reload.", chunk_chars=3, pause_after_chunks=2, hold=(answer := threading.Event())))
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        # A turn started elsewhere over HTTP; that client drops after the tool ran.
        first = await stream(http, "live", {"message": "write a.txt then answer"}, until=lambda m: m.event == "tool_result")
    assert first.kinds[-1] == "tool_result"

    page, errors = await open_console(browser, stack)
    await page.goto(stack.http_url + "/#/sessions/live")
    log = page.get_by_role("log", name="Conversation")
    await expect(page.get_by_role("button", name="Cancel")).to_be_visible()  # the answer is held mid-stream
    answer.set()
    await expect(log.locator(".turn .bubble.assistant").last).to_have_text("AgentFinished after the reload.")
    # The turn shows once: its user message, its tool card, its answer.
    await expect(log.locator(".bubble.user")).to_have_count(1)
    await expect(log.locator(".tool-card", has_text="write_file")).to_have_count(1)
    await expect(log.locator(".tool-card", has_text="write_file")).to_have_attribute("data-state", "ok")
    await expect(page.get_by_role("button", name="Cancel")).to_be_hidden()
    errors.assert_none()


async def test_reasoning_and_the_task_board_are_shown(browser, stack, llm):
    # Deep mode: the numbered plan becomes the session's task board; the model then works it.
    llm.add(
        reply("1. Write the report", reasoning="The user wants a report; I will track it on the board."),
        reply("", tool_call("task_update", {"id": 1, "status": "done"}, id="t1")),
        reply("The report is done."),
    )
    page, errors = await open_console(browser, stack)
    await page.get_by_label("Deep mode").check()
    await send(page, "write the report and track it")
    await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("The report is done.")
    reasoning = page.locator(".reasoning-card")
    await expect(reasoning.locator(".reasoning-text")).to_be_hidden()  # folded until opened
    await reasoning.locator("summary").click()
    await expect(reasoning).to_contain_text("I will track it on the board.")
    # The answer holds none of the reasoning.
    await expect(page.locator(".turn .bubble.assistant").last).not_to_contain_text("track it on the board")
    board = page.locator(".tasks-card")
    await expect(board).to_contain_text("1 of 1 done")
    await expect(board.locator("li.task")).to_have_count(1)
    await expect(board.locator("li.task")).to_have_attribute("data-status", "done")
    await expect(board.locator("li.task")).to_contain_text("#1 Write the report")
    errors.assert_none()


async def test_images_go_with_a_message_chosen_dropped_and_pasted(browser, stack, llm):
    import base64

    from tests.support.pictures import png

    chosen, dropped, pasted = png(2, 2, shade=1), png(2, 2, shade=2), png(2, 2, shade=3)
    llm.add(reply("Three grey squares."))
    page, errors = await open_console(browser, stack)
    await page.get_by_label("Add images").set_input_files(
        files=[{"name": "chosen.png", "mimeType": "image/png", "buffer": chosen}])
    for event, picture, name in (("drop", dropped, "dropped.png"), ("paste", pasted, "pasted.png")):
        await page.evaluate(
            """([event, b64, name]) => {
                 const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                 const data = new DataTransfer();
                 data.items.add(new File([bytes], name, { type: "image/png" }));
                 const target = document.getElementById(event === "drop" ? "composer" : "message");
                 const init = { bubbles: true, cancelable: true };
                 target.dispatchEvent(event === "drop" ? new DragEvent("drop", { ...init, dataTransfer: data })
                                                       : new ClipboardEvent("paste", { ...init, clipboardData: data }));
               }""", [event, base64.b64encode(picture).decode(), name])
    tray = page.get_by_role("list", name="Images to send")
    await expect(tray.locator("img")).to_have_count(3)
    await send(page, "What are these?")
    await expect(page.locator(".turn .bubble.assistant .text").last).to_have_text("Three grey squares.")
    await expect(page.locator(".bubble.user .images img")).to_have_count(3)
    await expect(tray).to_be_hidden()

    sent = llm.requests[0].body["messages"][-1]["content"]
    urls = [part["image_url"]["url"] for part in sent if part["type"] == "image_url"]
    assert urls == [f"data:image/png;base64,{base64.b64encode(p).decode()}" for p in (chosen, dropped, pasted)]
    # Opened again, the stored message names its images (the transcript holds references).
    await page.reload()
    await expect(page.locator(".bubble.user .image-ref")).to_have_text(
        ["[image: chosen.png]", "[image: dropped.png]", "[image: pasted.png]"])
    errors.assert_none()


async def test_a_message_forks_into_a_new_session_that_goes_on_differently(browser, stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("write_file", {"path": "draft.txt", "content": "v1"}, id="w1")), reply("Draft one is written."),
            reply("Second answer, as it was."))
    for message in ("write draft one", "what next?"):
        async for _ in gateway.Chat(gateway_pb2.ChatRequest(session_id="timeline", message=message), timeout=60):
            pass

    page, errors = await open_console(browser, stack)
    await page.goto(stack.http_url + "/#/sessions/timeline")
    log = page.get_by_role("log", name="Conversation")
    await expect(log.locator(".bubble.assistant")).to_have_count(2)
    # Keyboard only: the fork button of the first answer is reached and pressed from the keyboard.
    fork = log.locator(".message", has_text="Draft one is written.").get_by_role("button", name=re.compile("^Fork the conversation at #"))
    await fork.focus()
    await expect(fork).to_be_focused()
    await page.keyboard.press("Enter")

    await expect(page.locator("#subagents")).to_contain_text("Forked from timeline at message")
    await expect(page.locator("#session-title")).to_have_text("timeline (fork)")
    await expect(log.locator(".bubble.assistant")).to_have_text([re.compile("Draft one is written.")])
    await expect(log.locator(".bubble", has_text="Second answer")).to_have_count(0)
    forked_id = re.search(r"#/sessions/(.+)$", page.url).group(1)
    assert (stack.settings.home / "workspaces" / forked_id / "draft.txt").read_text() == "v1"

    llm.add(reply("Another way forward."))
    await send(page, "let's try something else")
    await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("Another way forward.")
    source = await gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="timeline"), timeout=10)
    assert [m.content for m in source.messages if m.role == "assistant" and m.content] == ["Draft one is written.",
                                                                                          "Second answer, as it was."]
    await page.locator("#subagents").get_by_role("button", name="timeline").click()
    await expect(page.locator("#session-title")).to_have_text("timeline")
    errors.assert_none()


async def test_a_held_call_is_edited_before_it_runs_or_denied_with_a_note(browser, tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}) as stack:
        llm.add(reply("", tool_call("shell", {"command": "echo from-the-model > out.txt"}, id="s1")), reply("It ran."))
        page, errors = await open_console(browser, stack)
        await send(page, "run the command")
        card = page.locator(".tool-card", has_text="shell")
        await expect(card).to_have_attribute("data-state", "held")

        # Keyboard only: Edit arguments opens the editor, focused; a schema the edit breaks is refused, the call waits.
        await card.get_by_role("button", name="Edit arguments").focus()
        await page.keyboard.press("Enter")
        editor = card.get_by_label("Arguments to run the call with (JSON)")
        await expect(editor).to_be_focused()
        await editor.fill('{"command": 5}')
        await card.get_by_role("button", name="Approve with these arguments").click()
        await expect(card.get_by_role("alert")).to_contain_text("invalid arguments for shell")
        await expect(card).to_have_attribute("data-state", "held")
        await editor.fill('{"command": "echo edited-in-the-console > out.txt && cat out.txt"}')
        await card.get_by_role("button", name="Approve with these arguments").click()

        await expect(card).to_have_attribute("data-state", "ok")
        await expect(card).to_contain_text("Approved with edited arguments (by you)")
        await expect(card.locator(".tool-output")).to_contain_text("edited-in-the-console")
        await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("It ran.")
        assert [p.read_text() for p in (stack.settings.home / "workspaces").glob("*/out.txt")] == ["edited-in-the-console\n"]

        # Deny with a note: the model reads why.
        llm.add(reply("", tool_call("shell", {"command": "rm -rf /tmp/x"}, id="s2")), reply("Understood."))
        await send(page, "clean up")
        second = page.locator(".tool-card", has_text="rm -rf")
        await expect(second).to_have_attribute("data-state", "held")
        await second.get_by_label("Why (sent to the model with a denial)").fill("not on a Friday")
        await second.get_by_role("button", name="Deny").click()
        await expect(second).to_contain_text("Denied (by you): not on a Friday")
        await expect(second).to_have_attribute("data-state", "error")
        await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("Understood.")
        assert "denied by the user: not on a Friday" in str(llm.requests[-1].messages)
        await page.screenshot(path=tmp_path / "console-approval-edit.png")
        errors.assert_none(allowed=("status of 400",))  # the refused edit's answer


async def test_approve_the_rest_of_the_turn_runs_every_held_call(browser, tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}) as stack:
        llm.add(reply("", tool_call("shell", {"command": "echo one > one.txt"}, id="a1")),
                reply("", tool_call("shell", {"command": "echo two > two.txt"}, id="a2")), reply("Both ran."))
        page, errors = await open_console(browser, stack)
        await send(page, "run both")
        first = page.locator(".tool-card", has_text="one.txt")
        await expect(first).to_have_attribute("data-state", "held")
        await first.get_by_role("button", name="Approve the rest of this turn").click()
        await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("Both ran.")
        await expect(page.locator(".tool-card[data-state='ok']")).to_have_count(2)
        names = sorted(p.name for p in (stack.settings.home / "workspaces").glob("*/*.txt"))
        assert names == ["one.txt", "two.txt"]
        errors.assert_none()
