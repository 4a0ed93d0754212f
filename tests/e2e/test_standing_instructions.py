"""Standing instructions end to end: set over the memory service's API and the CLI, stored
durably per namespace, and carried in the system prompt of every model call of the namespace's
turns — deep mode's steps and (compacted) its sub-agents' too. All five services over real
gRPC, the model a scripted OpenAI-compatible HTTP server."""

from __future__ import annotations

import grpc

from agentmesh.internal.v1 import memory_service_pb2_grpc
from agentmesh.v1 import gateway_pb2, learning_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error
from tests.e2e.test_auth_and_cli import run_cli
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack

SOUL = "You are Quill, a terse release engineer. Sign off with '-- Q'."
USER = "The user is Ada; she reads on a phone, so keep answers short."
PROJECT = "The project is agentmesh, a Python gRPC service mesh."


def user_memory_stub(stack: Stack) -> memory_service_pb2_grpc.MemoryStub:
    """The memory service as a user (the CLI, an SDK) reaches it: no service token."""
    return memory_service_pb2_grpc.MemoryStub(stack.user_channel("memory"))


async def set_part(stub, namespace: str, part: str, text: str) -> learning_pb2.Profile:
    return await stub.SetProfile(learning_pb2.SetProfileRequest(namespace=namespace, part=part, text=text), timeout=10)


async def session_in(gateway, session_id: str, namespace: str) -> None:
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id, namespace=namespace), timeout=10)


def system_of(request) -> str:
    return request.body["messages"][0]["content"]


async def test_profile_parts_are_stored_per_namespace_bounded_and_survive_a_restart(stack):
    stub = user_memory_stub(stack)
    await set_part(stub, "team-a", "soul", SOUL)
    profile = await set_part(stub, "team-a", "project", PROJECT + "\n")
    assert (profile.namespace, profile.soul, profile.user, profile.project) == ("team-a", SOUL, "", PROJECT)
    assert profile.max_chars == 4000 and profile.updated_at > 0

    too_long = await rpc_error(set_part(stub, "team-a", "soul", "x" * 4001))
    assert too_long.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert too_long.details().startswith("the soul text is 4001 characters; a profile part may hold at most 4000")
    unknown = await rpc_error(set_part(stub, "team-a", "persona", "hi"))
    assert unknown.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert unknown.details() == "there is no profile part 'persona': use one of soul, user, project"
    bad_namespace = await rpc_error(set_part(stub, "no spaces", "soul", "hi"))
    assert bad_namespace.code() == grpc.StatusCode.INVALID_ARGUMENT

    # Another namespace sees nothing of it; the refused writes changed nothing.
    other = await stub.GetProfile(learning_pb2.GetProfileRequest(namespace="team-b"), timeout=10)
    assert (other.soul, other.user, other.project, other.updated_at) == ("", "", "", 0)

    await stack.restart()
    stub = user_memory_stub(stack)
    # wait_for_ready: the process-wide subchannel to the old port may still be backing off.
    kept = await stub.GetProfile(learning_pb2.GetProfileRequest(namespace="team-a"), timeout=10, wait_for_ready=True)
    assert (kept.soul, kept.project) == (SOUL, PROJECT)
    cleared = await set_part(stub, "team-a", "soul", "")
    assert (cleared.soul, cleared.project) == ("", PROJECT)


async def test_every_model_call_of_the_namespace_carries_them_in_a_fixed_order(stack, llm):
    stub = user_memory_stub(stack)
    # Set in another order than the prompt's: the prompt's order is fixed, not the writes'.
    for part, text in (("project", PROJECT), ("user", USER), ("soul", SOUL)):
        await set_part(stub, "team-a", part, text)
    gateway = stack.gateway_stub()
    await session_in(gateway, "with", "team-a")
    await session_in(gateway, "without", "team-b")

    llm.add(reply("", tool_call("shell", {"command": "echo hi"})), reply("Done. -- Q"), reply("Hello."))
    events = await chat(gateway, "with", "say hi")
    assert of_kind(events, "run_finished")[0].final_text == "Done. -- Q"
    await chat(gateway, "without", "say hi")

    first, second, elsewhere = (system_of(r) for r in llm.requests)
    assert first == second  # every step, not only the first
    at = [first.index(text) for text in (SOUL, USER, PROJECT)]
    assert at == sorted(at)
    assert first.index("Standing instructions for this namespace") < at[0]
    assert at[-1] < first.index("Today is")  # right after the base prompt
    assert "## Persona\n" + SOUL in first and "## About the user\n" + USER in first
    assert SOUL not in elsewhere and "Standing instructions" not in elsewhere


def deep_model(request):
    last = request.body["messages"][-1]
    if last["role"] == "system" and "numbered plan" in last["content"]:
        return reply("1. delegate\n2. answer")
    if "You are a sub-agent" in system_of(request):
        return reply("sub-agent done")
    if not any(m["role"] == "tool" for m in request.body["messages"]):
        return reply("", tool_call("delegate_task", {"task": "Say done."}))
    return reply("All done.")


async def test_deep_mode_has_them_and_its_sub_agents_a_compact_version(tmp_path):
    long_project = "Project notes. " + "detail " * 400  # ~2.8k characters: a sub-agent gets the head
    with ScriptedLLMServer(default=deep_model) as llm:
        stack = Stack(tmp_path / "home", llm_base_url=llm.base_url, env={"AGENTMESH_AGENT_TASK_MODES": "none"})
        await stack.start()
        try:
            stub = user_memory_stub(stack)
            await set_part(stub, "team-a", "soul", SOUL)
            await set_part(stub, "team-a", "project", long_project)
            gateway = stack.gateway_stub()
            await session_in(gateway, "deep", "team-a")
            events = await chat(gateway, "deep", "do it deeply", mode="deep")
        finally:
            await stack.stop()
    assert of_kind(events, "run_finished")[0].final_text == "All done."
    prompts = [system_of(r) for r in llm.requests]
    child = [p for p in prompts if "You are a sub-agent" in p]
    parent = [p for p in prompts if "You are a sub-agent" not in p]
    assert child and len(parent) >= 3  # the plan, the delegating step, the answer
    assert all(SOUL in p and long_project.strip() in p for p in parent)
    assert SOUL in child[0] and long_project.strip() not in child[0]
    assert long_project[:500] in child[0] and " […]" in child[0]


async def test_cli_profile_set_show_and_clear(stack, tmp_path):
    soul = tmp_path / "soul.md"
    soul.write_text(SOUL + "\n")
    code, out, err = await run_cli(stack, "profile", "set", "soul", str(soul), "--namespace", "team-a")
    assert code == 0, err
    assert out.strip() == f"soul set for namespace team-a ({len(SOUL)} characters)"
    code, out, _ = await run_cli(stack, "profile", "show", "--namespace", "team-a")
    assert code == 0 and out.startswith(f"## soul\n{SOUL}\n\n## user\n(not set)\n")

    big = tmp_path / "big.md"
    big.write_text("y" * 5000)
    code, _, err = await run_cli(stack, "profile", "set", "user", str(big), "--namespace", "team-a")
    assert code == 1 and "a profile part may hold at most 4000" in err

    code, out, _ = await run_cli(stack, "profile", "clear", "soul", "--namespace", "team-a")
    assert code == 0
    code, out, _ = await run_cli(stack, "profile", "show", "--namespace", "team-a", "--json")
    assert code == 0 and '"soul": ""' in out


async def test_the_gateway_api_sets_and_reads_them_with_the_memory_services_refusals(stack):
    gateway = stack.gateway_stub()
    profile = await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="team-a", part="user", text=USER),
                                       timeout=10)
    assert (profile.namespace, profile.user) == ("team-a", USER)
    read = await gateway.GetProfile(learning_pb2.GetProfileRequest(namespace="team-a"), timeout=10)
    assert (read.soul, read.user, read.max_chars) == ("", USER, 4000)
    too_long = await rpc_error(gateway.SetProfile(
        learning_pb2.SetProfileRequest(namespace="team-a", part="user", text="z" * 4001), timeout=10))
    assert too_long.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "a profile part may hold at most 4000" in too_long.details()
    # The same record the memory service's own API reads.
    direct = await user_memory_stub(stack).GetProfile(learning_pb2.GetProfileRequest(namespace="team-a"), timeout=10)
    assert direct.user == USER
