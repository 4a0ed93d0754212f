"""A 5,000-message session in the console (real headless Chromium, the whole stack over real
HTTP): it opens at its end and scrolls to its start with only a window of it in the page, and a
deep link opens it at one message."""

from __future__ import annotations

import pytest

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2, gateway_pb2
from tests.support.stack import Stack
from tests.web.browser import needs_chromium
from tests.web.test_console import browser, expect, open_console  # noqa: F401 - the browser fixture

pytestmark = needs_chromium

MESSAGES = 5000

IN_VIEW = """selector => {
    const element = document.querySelector(selector);
    if (!element) return false;
    const box = element.getBoundingClientRect();
    const view = document.getElementById("log").getBoundingClientRect();
    return box.height > 0 && box.bottom > view.top && box.top < view.bottom;
}"""


async def in_view(page, selector: str) -> None:
    """Wait until the element is shown within the conversation's visible area."""
    await page.wait_for_function(IN_VIEW, arg=selector)


async def long_session(stack: Stack, session_id: str, count: int = MESSAGES) -> None:
    """`count` messages, a question and an answer in turn, written as the agent appends them."""
    gateway, memory = stack.gateway_stub(), stack.memory_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id, title="a long one"), timeout=10)
    batch = []
    for seq in range(1, count + 1):
        role = "user" if seq % 2 else "assistant"
        batch.append(common_pb2.Message(role=role, content=f"{role} message number {seq}" + (" and more" * (seq % 7))))
        if len(batch) == 1000:
            await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(session_id=session_id, messages=batch),
                                        timeout=60)
            batch = []
    if batch:
        await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(session_id=session_id, messages=batch),
                                    timeout=60)


@pytest.fixture
async def stack(tmp_path):
    async with Stack(tmp_path / "home") as running:
        await long_session(running, "long")
        yield running


async def test_a_5000_message_session_opens_at_its_end_and_scrolls_with_a_window_of_it(browser, stack):  # noqa: F811
    page, errors = await open_console(browser, stack)
    await page.goto(stack.http_url + "/#/sessions/long")
    log = page.get_by_role("log", name="Conversation")
    last = f".bubble[data-seq='{MESSAGES}']"
    await in_view(page, last)
    # Only a window of the conversation is in the page.
    shown = await log.locator(".bubble").count()
    assert 0 < shown < 200, shown

    # Scrolled to the start, step by step as a wheel would, the first message comes into view.
    await page.evaluate("""async () => {
        const log = document.getElementById("log");
        while (log.scrollTop > 0) {
            log.scrollTop = Math.max(0, log.scrollTop - 20000);
            await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
        }
    }""")
    await in_view(page, ".bubble[data-seq='1']")
    assert await log.locator(".bubble").count() < 200
    # And back down to the end with the keyboard.
    await log.focus()
    await page.keyboard.press("End")
    await in_view(page, last)
    errors.assert_none()


async def test_a_deep_link_opens_the_session_at_the_message(browser, stack):  # noqa: F811
    page, errors = await open_console(browser, stack)
    await page.goto(stack.http_url + "/#/sessions/long/messages/2501")
    target = page.locator(".bubble[data-seq='2501']")
    await in_view(page, ".bubble[data-seq='2501']")
    await expect(target).to_be_focused()
    await expect(target).to_contain_text("user message number 2501")
    # Each message carries its link.
    link = page.locator(".message", has=page.locator(".bubble[data-seq='2501']")).get_by_role("link", name="Link to #2501")
    assert (await link.get_attribute("href")) == "#/sessions/long/messages/2501"
    # Another message of the open session: the window moves there without reopening the session.
    await page.evaluate("location.hash = '#/sessions/long/messages/40'")
    await expect(page.locator(".bubble[data-seq='40']")).to_be_focused()
    await in_view(page, ".bubble[data-seq='40']")
    errors.assert_none()
