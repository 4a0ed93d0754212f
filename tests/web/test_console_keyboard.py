"""The console with the keyboard alone, in real headless Chromium against the whole stack: Tab
reaches every main control in order — the skip link, the views, the sessions, the session's
tabs, the conversation, a held call's decisions, the composer's controls — and each draws its
focus; a message is typed and sent, a held call approved, a tab switched, a view opened, all
without the mouse."""

from __future__ import annotations

import pytest

from agentmesh.v1 import gateway_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.web.browser import needs_chromium
from tests.web.test_console import browser, expect, open_console  # noqa: F401 - the browser fixture

pytestmark = needs_chromium

# What has focus: its accessible name (aria-label, its label, else its text), and whether the
# focus is drawn — on the element, or for a visually hidden file input on its visible label.
FOCUSED = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const label = e.labels && e.labels.length ? e.labels[0] : null;
  // A label's own words, not those of the control inside it (a select's options).
  const words = label ? [...label.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent).join('') : '';
  const name = (e.getAttribute('aria-label') || words.trim() || e.textContent || '').trim();
  const drawn = (el) => { const s = getComputedStyle(el); return s.outlineStyle !== 'none' && s.outlineWidth !== '0px'; };
  // A visually hidden control (the file input) shows its focus on its label, or not at all.
  const hidden = getComputedStyle(e).clip === 'rect(0px, 0px, 0px, 0px)';
  return {name, drawn: hidden ? label !== null && drawn(label) : drawn(e)};
}"""

MAIN_CONTROLS = [
    "Skip to the conversation", "Chat", "Usage", "Activity", "Skills", "Memory", "Jobs", "Tasks", "Dev panel",
    "New session", "Delete session", "Conversation", "Approve", "Approve the rest of this turn", "Deny",
    "Message", "Add images", "Deep mode", "Plan first", "Agent", "Model", "Approvals", "Send",
]


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}) as running:
        yield running


async def tab_through(page, limit: int = 120) -> list[dict]:
    """Press Tab until the focus comes back round (or `limit` presses): what took focus, in
    order, from the page's first control (the skip link)."""
    seen: list[dict] = []
    for _ in range(limit):
        await page.keyboard.press("Tab")
        focused = await page.evaluate(FOCUSED)
        if focused is None:
            continue
        if seen and focused["name"] == seen[0]["name"]:
            break
        seen.append(focused)
    first = next(i for i, f in enumerate(seen) if f["name"] == "Skip to the conversation")
    return seen[first:] + seen[:first]


async def test_every_main_control_is_reached_by_tab_with_its_focus_drawn(browser, stack, llm):  # noqa: F811
    await stack.gateway_stub().CreateSession(gateway_pb2.CreateSessionRequest(session_id="older", title="An older session"),
                                             timeout=10)
    llm.add(reply("", tool_call("shell", {"command": "echo by keyboard > k.txt"}, id="k1")), reply("It ran."))
    page, errors = await open_console(browser, stack, viewport={"width": 1280, "height": 860})
    await expect(page.locator("button.session", has_text="An older session")).to_be_visible()

    # Typed and sent from the keyboard: Tab to the message box, type, Enter.
    await page.locator("body").focus()
    for _ in range(80):
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement && document.activeElement.id") == "message":
            break
    await page.keyboard.type("run it")
    await page.keyboard.press("Enter")
    held = page.locator(".tool-card[data-state='held']")
    await expect(held).to_be_visible()
    # The held call takes the focus, so Enter decides it.
    await expect(held.get_by_role("button", name="Approve", exact=True)).to_be_focused()

    order = await tab_through(page)
    names = [f["name"] for f in order]
    missing = [name for name in MAIN_CONTROLS if name not in names]
    assert missing == [], names
    positions = [names.index(name) for name in MAIN_CONTROLS]
    assert positions == sorted(positions), names  # in reading order
    undrawn = [f["name"] for f in order if not f["drawn"]]
    assert undrawn == [], undrawn

    await held.get_by_role("button", name="Approve", exact=True).focus()
    await page.keyboard.press("Enter")
    await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("It ran.")
    assert [p.read_text() for p in (stack.settings.home / "workspaces").glob("*/k.txt")] == ["by keyboard\n"]

    # The session's tabs move with the arrow keys; a view opens from its link with Enter and
    # its heading takes the focus.
    await page.get_by_role("tab", name="Chat").focus()
    await page.keyboard.press("ArrowRight")
    await expect(page.get_by_role("tab", name="Workspace")).to_be_focused()
    await expect(page.get_by_role("tabpanel")).to_have_attribute("id", "panel-workspace")
    await page.get_by_role("navigation", name="Console views").get_by_role("link", name="Usage").focus()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Usage", level=2)).to_be_focused()
    errors.assert_none()
