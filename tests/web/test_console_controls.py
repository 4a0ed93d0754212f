"""The console's composer drives the API as the CLI does — in real headless Chromium, against the
whole stack (five real gRPC services, the scripted model) over real HTTP: a message typed while
a turn runs interrupts it or waits in the queue, plan mode holds the plan for approval, the
session's model and permission mode are picked, the context fill and the reasoning are shown."""

from __future__ import annotations

import pytest

from agentmesh.v1 import sessions_pb2
from tests.e2e.test_plan_mode import model as planning_model
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack
from tests.web.browser import needs_chromium
from tests.web.test_console import browser, expect, open_console, send  # noqa: F401 - the browser fixture

pytestmark = needs_chromium


@pytest.fixture
async def stack(tmp_path, llm):
    # shell is held for approval: a turn waiting on it runs for as long as the test needs.
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}) as running:
        yield running


async def test_typing_while_a_turn_runs_interrupts_it_or_queues(browser, stack, llm):  # noqa: F811 - fixture
    llm.add(reply("Starting.", tool_call("shell", {"command": "echo one"}, id="s1")), reply("Answer to the interruption."))
    page, errors = await open_console(browser, stack)
    await send(page, "run something long")
    first = page.locator(".turn").first
    await expect(first.locator(".tool-card")).to_have_attribute("data-state", "held")
    # While it runs, Send stays available and the choice of what a new message does is offered.
    busy = page.get_by_label("While a turn runs, what I send")
    await expect(busy).to_be_visible()
    await expect(busy).to_have_value("interrupt")
    await expect(page.get_by_role("button", name="Send")).to_be_enabled()
    await send(page, "stop, answer this instead")

    await expect(first).to_contain_text("Stopped: interrupted")
    await expect(page.locator(".turn").nth(1).locator(".bubble.assistant")).to_contain_text("Answer to the interruption.")
    await expect(busy).to_be_hidden()

    # Queued: the new message waits for the running turn to end, then runs.
    llm.add(reply("", tool_call("shell", {"command": "echo two"}, id="s2")), reply("The first one ran."),
            reply("The queued answer."))
    await send(page, "run another")
    third = page.locator(".turn").nth(2)
    await expect(third.locator(".tool-card")).to_have_attribute("data-state", "held")
    await busy.select_option("enqueue")
    await expect(page.locator("#busy-hint")).to_contain_text("Waits for the running turn to end")
    await send(page, "and after that, this")
    await expect(third.locator(".tool-card")).to_have_attribute("data-state", "held")  # still waiting, not interrupted
    await third.get_by_role("button", name="Approve", exact=True).click()
    await expect(third.locator(".bubble.assistant").last).to_contain_text("The first one ran.")
    await expect(third).not_to_contain_text("Stopped")
    await expect(page.locator(".turn").nth(3).locator(".bubble.assistant")).to_contain_text("The queued answer.")
    # The context-fill figure of the last turn's status event.
    await expect(page.locator("#context-fill")).to_contain_text("Context")
    await expect(page.locator("#context-fill")).to_contain_text("tokens)")
    errors.assert_none()


async def test_plan_mode_shows_the_plan_for_approval(browser, tmp_path):  # noqa: F811 - fixture
    with ScriptedLLMServer(default=planning_model) as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
            page, errors = await open_console(browser, stack)
            await page.get_by_label("Plan first").check()
            await send(page, "write the notes")
            card = page.locator(".tool-card", has_text="approve_plan")
            await expect(card).to_have_attribute("data-state", "held")
            await expect(card.get_by_label("The plan to approve")).to_have_text("1. write notes.txt\n2. report")
            assert not list((stack.settings.home / "workspaces").glob("*/notes.txt"))  # nothing ran
            await card.get_by_role("button", name="Approve the plan").click()
            await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("Done as planned.")
            assert [p.read_text() for p in (stack.settings.home / "workspaces").glob("*/notes.txt")] == ["plan ran"]
            errors.assert_none()


async def test_the_sessions_model_and_permission_mode_are_picked_and_kept(browser, stack, llm):  # noqa: F811
    gateway = stack.gateway_stub()
    llm.add(reply("First."))
    page, errors = await open_console(browser, stack)
    await send(page, "hello")
    await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("First.")
    session_id = page.url.split("#/sessions/")[1]

    await page.get_by_label("Approvals").select_option("manual")
    await expect(page.locator("#controls-status")).to_contain_text("Permission mode: manual")
    session = await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id=session_id), timeout=10)
    assert session.permission_mode == "manual"
    # Manual: the next call is held, as the picker said.
    llm.add(reply("", tool_call("read_file", {"path": "x.txt"}, id="r1")), reply("Read it."))
    await send(page, "read x.txt")
    await expect(page.locator(".tool-card", has_text="read_file")).to_have_attribute("data-state", "held")
    await page.locator(".tool-card", has_text="read_file").get_by_role("button", name="Approve", exact=True).click()
    await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("Read it.")

    # Reopened, the session shows its own choices.
    await page.reload()
    await expect(page.get_by_label("Approvals")).to_have_value("manual")
    await expect(page.get_by_label("Model")).to_have_value("")
    errors.assert_none()


async def test_the_agent_picker_sends_each_message_to_the_chosen_agent(browser, stack, llm):  # noqa: F811
    from agentmesh.v1 import agents_pb2

    await stack.gateway_stub().CreateAgent(agents_pb2.CreateAgentRequest(namespace="default", spec=agents_pb2.AgentSpec(
        name="poet", description="Answers in verse.", instructions="You are POET; answer in verse.")), timeout=30)
    llm.add(reply("Roses are red."))
    page, errors = await open_console(browser, stack)
    picker = page.locator("#agent-picker")
    await expect(picker.locator("option[value=poet]")).to_have_count(1)
    await picker.select_option("poet")
    await send(page, "write me a line")
    await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("Roses are red.")
    (request,) = llm.requests
    assert "You are POET" in request.messages[0]["content"]
    session_id = page.url.split("#/sessions/")[1]
    session = await stack.gateway_stub().GetSession(sessions_pb2.GetSessionRequest(session_id=session_id), timeout=10)
    assert (session.agent, session.agent_version) == ("poet", 1)

    # Reopened, the picker shows the agent the session ran.
    await page.reload()
    await expect(page.locator("#agent-picker")).to_have_value("poet")
    errors.assert_none()


async def test_a_sessions_model_picker_offers_its_namespaces_own_models(browser, tmp_path, llm):  # noqa: F811
    """A ModelConfig's model (NamespaceSettings.models) is in the picker of a session of its
    namespace, marked with it; picked, the session's next message goes to that model's server."""
    secrets = tmp_path / "model-secrets" / "default" / "team-llm"
    secrets.mkdir(parents=True)
    (secrets / "api-key").write_text("sk-console-own-0123456789")
    env = {"AGENTMESH_MODEL_SECRETS_DIR": str(tmp_path / "model-secrets")}
    with ScriptedLLMServer() as own:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
            await stack.gateway_stub().UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
                namespace="default", models=sessions_pb2.NamespaceModels(models=[sessions_pb2.NamespaceModel(
                    name="own", provider="openai", base_url=own.base_url, model="own-model",
                    api_key_secret="team-llm", api_key_secret_key="api-key")])), timeout=10)
            llm.add(reply("First."))
            page, errors = await open_console(browser, stack)
            await send(page, "hello")
            await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("First.")
            await page.reload()  # the session opened: its namespace is known
            picker = page.get_by_label("Model")
            await expect(picker.locator("option[value=own]")).to_have_text("own (default)")
            await picker.select_option("own")
            await expect(page.locator("#controls-status")).to_contain_text("own")
            own.add(reply("From the namespace's model."))
            await send(page, "again")
            await expect(page.locator(".turn .bubble.assistant").last).to_contain_text("From the namespace's model.")
            assert own.requests[-1].body["model"] == "own-model"
            await page.reload()
            await expect(page.get_by_label("Model")).to_have_value("own")
            errors.assert_none()
