"""StartTurn over real gRPC: the transcript as it stood, the turn's message appended after it,
and recall — in one call — and the agent's adapter of it, paging a long transcript."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.agent.adapters.memory import GrpcTurnStart
from agentmesh.agent.types import ChatMessage
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2


def user(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="user", content=text)


def start(session_id: str, text: str, **kw) -> memory_service_pb2.StartTurnRequest:
    return memory_service_pb2.StartTurnRequest(session_id=session_id, messages=[user(text)], **kw)


async def test_start_turn_reads_then_appends_and_recalls(memory_service):
    client, stub = memory_service.client, memory_service.stub
    await client.put_session("s1", namespace="alice")
    await client.append_messages("s1", [user("one"), user("two")])
    await client.remember("Alice drinks green tea every morning", namespace="alice")
    await client.remember("Bob drinks coffee", namespace="bob")

    reply = await stub.StartTurn(start("s1", "what does alice drink", namespace="alice",
                                       recall_query="what does alice drink", recall_k=3))

    assert [m.content for m in reply.messages] == ["one", "two"]  # before the append, not after
    assert (reply.next_after_seq, reply.first_seq, reply.last_seq) == (0, 3, 3)
    assert [h.memory.text for h in reply.recalled] == ["Alice drinks green tea every morning"]
    assert reply.recall_error == ""
    stored, _ = await client.list_messages("s1")
    assert [m.content for m in stored] == ["one", "two", "what does alice drink"]  # durably appended


async def test_start_turn_pages_a_long_transcript_and_a_failed_recall_does_not_fail_it(memory_service):
    client, stub = memory_service.client, memory_service.stub
    await client.put_session("long")
    await client.append_messages("long", [user(f"m{i}") for i in range(1, 8)])

    reply = await stub.StartTurn(start("long", "next", page_size=3, recall_query=" ", recall_k=2))

    assert [m.seq for m in reply.messages] == [1, 2, 3] and reply.next_after_seq == 3
    assert (reply.first_seq, reply.last_seq) == (8, 8)
    assert not reply.recalled and "query is empty" in reply.recall_error
    # The agent's adapter reads the rest, up to (not including) what it appended.
    begun = await GrpcTurnStart(client, "memory").start("long", [ChatMessage(role="user", content="again")],
                                                        namespace="default", query="again", k=0, recall_timeout_s=1)
    assert [m.content for m in begun.stored] == [*(f"m{i}" for i in range(1, 8)), "next"]
    assert begun.memories == [] and begun.recall_error == ""


async def test_start_turn_refuses_bad_input_and_changes_nothing(memory_service):
    client, stub = memory_service.client, memory_service.stub
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartTurn(start("missing", "hi"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "create it with PutSession" in err.value.details()
    await client.put_session("s2")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartTurn(memory_service_pb2.StartTurnRequest(session_id="s2", messages=[common_pb2.Message(role="robot")]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "role must be one of" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartTurn(start("s2", "hi", page_size=5000))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_size" in err.value.details()
    assert (await client.get_session("s2")).message_count == 0


async def test_only_the_agent_may_start_a_turn(memory_service):
    from agentmesh.config import Settings
    from agentmesh.internal.v1 import memory_service_pb2_grpc
    from tests.support.identities import signed_channel

    await memory_service.client.put_session("s3")
    keys = Settings.from_env(memory_service.env).keys_dir
    async with signed_channel(keys, "gateway", "memory", memory_service.host.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await memory_service_pb2_grpc.MemoryStub(channel).StartTurn(start("s3", "hi"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "only the agent service may" in err.value.details()
    assert (await memory_service.client.get_session("s3")).message_count == 0


def as_gateway(memory_service):
    """A channel to memory signed as the gateway (who sets profiles, skills and policies)."""
    from agentmesh.config import Settings
    from tests.support.identities import signed_channel

    return signed_channel(Settings.from_env(memory_service.env).keys_dir, "gateway", "memory",
                          memory_service.host.target)


async def test_start_turn_brings_the_learning_parts_asked_for(memory_service):
    from agentmesh.agent.capabilities.learning import INSTRUCTIONS, PROMOTED_TOOLS, SKILLS
    from agentmesh.internal.v1 import memory_service_pb2_grpc
    from agentmesh.v1 import learning_pb2

    client, stub = memory_service.client, memory_service.stub
    await client.put_session("s4", namespace="team")
    async with as_gateway(memory_service) as channel:
        gateway = memory_service_pb2_grpc.MemoryStub(channel)
        await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="team", part="soul", text="Be brief."))
        await gateway.PutSkill(learning_pb2.PutSkillRequest(namespace="team", files=[learning_pb2.SkillFile(
            path="SKILL.md", content="---\nname: deploy\ndescription: How we deploy.\n---\nRun make deploy.\n")]))
    await client.put_promoted_tool(learning_pb2.PromotedTool(
        namespace="team", name="double", description="Doubles.", function="double", source="def double(x: int) -> int: ...",
        parameters_json='{"type": "object", "properties": {"x": {"type": "integer"}}}'))

    plain = await stub.StartTurn(start("s4", "hi", namespace="team"))
    assert not plain.HasField("profile") and not plain.skills and not plain.promoted_tools

    asked = await stub.StartTurn(start("s4", "hi", namespace="team", with_profile=True, with_skills=True,
                                       with_promoted_tools=True))
    assert asked.learning_read and not asked.learning_errors
    assert asked.profile.soul == "Be brief."
    assert [s.name for s in asked.skills] == ["deploy"] and [t.name for t in asked.promoted_tools] == ["double"]

    # The agent's adapter turns them into what the learning capabilities read.
    begun = await GrpcTurnStart(client, "memory").start(
        "s4", [ChatMessage(role="user", content="again")], namespace="team", query="again", k=0, recall_timeout_s=1,
        learning=frozenset({INSTRUCTIONS, SKILLS, PROMOTED_TOOLS}))
    assert begun.learned is not None and begun.learned.instructions is not None
    assert begun.learned.instructions.soul == "Be brief."
    assert [s.name for s in begun.learned.skills or []] == ["deploy"]
    assert [t.name for t in begun.learned.promoted_tools or []] == ["double"]


async def test_a_learning_change_shows_in_the_next_turn_s_start(memory_service):
    # The embedded store keeps a namespace's listings between turns; every change through the
    # API must reach the next StartTurn.
    from agentmesh.internal.v1 import memory_service_pb2_grpc
    from agentmesh.v1 import learning_pb2

    client, stub = memory_service.client, memory_service.stub
    await client.put_session("s5", namespace="team")
    learn = {"namespace": "team", "with_profile": True, "with_skills": True, "with_promoted_tools": True}
    first = await stub.StartTurn(start("s5", "one", **learn))
    assert first.profile.soul == "" and not first.skills and not first.promoted_tools

    skill = "---\nname: deploy\ndescription: How we deploy.\n---\nRun make deploy.\n"
    async with as_gateway(memory_service) as channel:
        gateway = memory_service_pb2_grpc.MemoryStub(channel)
        await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="team", part="soul", text="Be brief."))
        await gateway.PutSkill(learning_pb2.PutSkillRequest(namespace="team", files=[
            learning_pb2.SkillFile(path="SKILL.md", content=skill)]))
        second = await stub.StartTurn(start("s5", "two", **learn))
        assert second.profile.soul == "Be brief." and [s.name for s in second.skills] == ["deploy"]

        await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="team", part="soul", text="Be thorough."))
        await gateway.RemoveSkill(learning_pb2.SkillName(namespace="team", name="deploy"))
    await client.put_promoted_tool(learning_pb2.PromotedTool(
        namespace="team", name="double", description="Doubles.", function="double", source="def double(x: int) -> int: ...",
        parameters_json='{"type": "object", "properties": {"x": {"type": "integer"}}}'))
    third = await stub.StartTurn(start("s5", "three", **learn))
    assert third.profile.soul == "Be thorough." and not third.skills
    assert [t.name for t in third.promoted_tools] == ["double"]
    assert [m.content for m in third.messages] == ["one", "two"]


async def test_put_session_brings_the_namespace_settings_when_asked(memory_service):
    from agentmesh.internal.v1 import memory_service_pb2_grpc
    from agentmesh.v1 import sessions_pb2

    async with as_gateway(memory_service) as channel:
        stub = memory_service_pb2_grpc.MemoryStub(channel)
        await stub.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
            namespace="team", tools=common_pb2.ToolPolicy(deny=["shell"])))
        session = sessions_pb2.Session(session_id="s5", namespace="team")
        plain = await stub.PutSession(memory_service_pb2.PutSessionRequest(session=session))
        # An existing session keeps its namespace, and the settings are that namespace's.
        asked = await stub.PutSession(memory_service_pb2.PutSessionRequest(
            session=sessions_pb2.Session(session_id="s5", namespace="other"), with_namespace_settings=True))
    assert plain.created and not plain.HasField("namespace_settings")
    assert not asked.created and asked.session.namespace == "team"
    assert list(asked.namespace_settings.tools.deny) == ["shell"]


async def test_an_append_records_the_usage_sent_with_it_and_a_bad_record_never_fails_the_append(memory_service):
    from agentmesh.internal.v1 import memory_service_pb2_grpc

    client = memory_service.client
    await client.put_session("s6")

    def record(id_: str, tokens: int) -> memory_service_pb2.UsageRecord:
        return memory_service_pb2.UsageRecord(id=id_, at=1_900_000_000.0, session_id="s6", run_id="r1", namespace="default",
                                      model_name="default", model="m", provider="openai", input_tokens=tokens,
                                      output_tokens=1)

    reply = await client.append_with_usage("s6", [user("one")], [record("r1.a", 10), record("r1.b", 20)])
    assert reply.last_seq == 1 and reply.usage_error == ""
    bad = await client.append_with_usage("s6", [user("two")], [record("r1.c", -5)])
    assert bad.last_seq == 2 and "input_tokens must be between 0" in bad.usage_error
    stored, _ = await client.list_messages("s6")
    assert [m.content for m in stored] == ["one", "two"]  # appended either way

    async with as_gateway(memory_service) as channel:
        sums = await memory_service_pb2_grpc.MemoryStub(channel).SumUsage(memory_service_pb2.SumUsageRequest(group_by="session"))
    assert [(s.key, s.calls, s.input_tokens) for s in sums.sums] == [("s6", 2, 30)]


async def test_start_turn_opens_the_session_and_runs_in_the_namespace_it_is_stored_in(memory_service):
    from agentmesh.internal.v1 import memory_service_pb2_grpc
    from agentmesh.v1 import sessions_pb2

    client, stub = memory_service.client, memory_service.stub
    await client.remember("Team members deploy on Fridays", namespace="team")
    async with as_gateway(memory_service) as channel:
        await memory_service_pb2_grpc.MemoryStub(channel).UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
            namespace="team", tools=common_pb2.ToolPolicy(deny=["shell"])))

    first = await stub.StartTurn(start("s7", "hello", session=sessions_pb2.Session(session_id="s7", namespace="team")))
    assert first.session_created and first.session.namespace == "team" and first.last_seq == 1
    assert list(first.namespace_settings.tools.deny) == ["shell"]
    # An existing session keeps its namespace: recall reads the stored one, not the one asked for.
    again = await stub.StartTurn(start("s7", "when do we deploy", namespace="default", recall_query="deploy",
                                       recall_k=3, session=sessions_pb2.Session(session_id="s7", namespace="default")))
    assert not again.session_created and again.session.namespace == "team"
    assert [h.memory.text for h in again.recalled] == ["Team members deploy on Fridays"]
    assert [m.content for m in again.messages] == ["hello"] and again.last_seq == 2
    # Without `session`, nothing of it comes back (the agent then resolves nothing).
    plain = await stub.StartTurn(start("s7", "plain"))
    assert not plain.HasField("session") and not plain.HasField("namespace_settings")

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.StartTurn(start("s8", "hi", session=sessions_pb2.Session(session_id="other")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "session.session_id" in (err.value.details() or "")
    from agentmesh.errors import NotFound

    with pytest.raises(NotFound):
        await client.get_session("s8")  # refused before anything was written
