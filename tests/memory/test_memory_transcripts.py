"""Sessions and transcripts over real gRPC: order, paging, concurrency, restarts, bad input."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentmesh.errors import InvalidArgument, NotFound
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2, sessions_pb2


def user(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="user", content=text)


async def test_put_session_creates_once_then_returns_the_existing_one(memory_service):
    client = memory_service.client
    first, created = await client.put_session("work", title="Work", namespace="alice", labels={"team": "a"})
    assert created and first.created_at > 0 and first.namespace == "alice"
    again, created_again = await client.put_session("work", title="Other title")
    assert not created_again
    assert again.title == "Work" and again.created_at == first.created_at and dict(again.labels) == {"team": "a"}
    fetched = await client.get_session("work")
    assert fetched.title == "Work" and fetched.message_count == 0


async def test_session_namespace_defaults_and_unknown_session_is_not_found(memory_service):
    session, _ = await memory_service.client.put_session("plain")
    assert session.namespace == "default"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await memory_service.stub.GetSession(sessions_pb2.GetSessionRequest(session_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in err.value.details()


async def test_a_messages_image_references_are_stored_and_read_back(memory_service):
    client = memory_service.client
    await client.put_session("pics")
    image = common_pb2.Image(path=".attachments/ab.png", media_type="image/png", name="shot.png", width=6, height=5,
                             size_bytes=90)
    await client.append_messages("pics", [common_pb2.Message(role="user", content="see", images=[image]), user("plain")])
    stored = await client.transcript("pics")
    assert [list(m.images) for m in stored] == [[image], []]


async def test_transcript_is_ordered_paged_and_survives_a_restart(memory_service):
    client = memory_service.client
    await client.put_session("s1")
    assert await client.append_messages("s1", [user("one"), user("two")]) == 2
    tool_call = common_pb2.ToolCall(call_id="c1", name="shell", arguments_json='{"command": "ls"}')
    assert (
        await client.append_messages(
            "s1",
            [
                common_pb2.Message(role="assistant", content="", tool_calls=[tool_call], run_id="r1"),
                common_pb2.Message(role="tool", content="a.txt", tool_call_id="c1", name="shell", run_id="r1"),
            ],
        )
        == 4
    )
    page, after = await client.list_messages("s1", page_size=3)
    assert [m.seq for m in page] == [1, 2, 3] and after == 3
    rest, after = await client.list_messages("s1", after_seq=after, page_size=3)
    assert [m.seq for m in rest] == [4] and after == 0

    await memory_service.restart()

    messages = await memory_service.client.transcript("s1")
    assert [m.content for m in messages] == ["one", "two", "", "a.txt"]
    assert messages[2].tool_calls[0].arguments_json == '{"command": "ls"}' and messages[2].run_id == "r1"
    assert messages[3].tool_call_id == "c1" and messages[3].name == "shell" and messages[3].created_at > 0
    assert (await memory_service.client.get_session("s1")).message_count == 4
    # Appending after the restart continues the numbering.
    assert await memory_service.client.append_messages("s1", [user("five")]) == 5


async def test_concurrent_appends_get_distinct_increasing_seqs(memory_service):
    client = memory_service.client
    await client.put_session("busy")
    results = await asyncio.gather(
        *(client.append_messages("busy", [user(f"m{i}"), user(f"m{i}b")]) for i in range(20))
    )
    assert sorted(results) == list(range(2, 41, 2))
    messages = await client.transcript("busy")
    assert [m.seq for m in messages] == list(range(1, 41))
    # Each append's two messages stay adjacent.
    for first, second in zip(messages[::2], messages[1::2], strict=True):
        assert second.content == first.content + "b"


async def test_delete_session_deletes_its_transcript(memory_service):
    client = memory_service.client
    await client.put_session("gone")
    await client.append_messages("gone", [user("secret"), user("more")])
    assert await client.delete_session("gone") is True
    assert await client.delete_session("gone") is False
    with pytest.raises(NotFound):
        await client.list_messages("gone")
    # The same id again starts an empty transcript: nothing of the old one shows through.
    await client.put_session("gone")
    assert await client.transcript("gone") == []
    await client.append_messages("gone", [user("fresh")])
    assert [m.content for m in await client.transcript("gone")] == ["fresh"]


async def test_list_sessions_pages_newest_first_without_gaps(memory_service):
    client = memory_service.client
    for i in range(7):
        await client.put_session(f"s{i}")
    seen, token = [], ""
    while True:
        page, token = await client.list_sessions(page_size=3, page_token=token)
        seen.extend(s.session_id for s in page)
        if not token:
            break
    assert seen == [f"s{i}" for i in reversed(range(7))]


async def test_list_sessions_pages_through_sessions_created_at_the_same_instant(memory_service):
    client = memory_service.client
    for i in range(5):
        session = sessions_pb2.Session(session_id=f"tie{i}", created_at=1_700_000_000.0)
        await memory_service.stub.PutSession(memory_service_pb2.PutSessionRequest(session=session))
    seen, token = [], ""
    while True:
        page, token = await client.list_sessions(page_size=2, page_token=token)
        seen.extend(s.session_id for s in page)
        if not token:
            break
    assert sorted(seen) == [f"tie{i}" for i in range(5)] and len(seen) == 5


@pytest.mark.parametrize(
    "session_id, messages, expected",
    [
        ("bad id!", [user("x")], "malformed"),
        ("s", [], "at least one message"),
        ("s", [common_pb2.Message(role="robot", content="x")], "role must be one of"),
        ("s", [user("x"), user("y" * (1024 * 1024 + 1))], "message 2: content is 1048577 bytes"),
        ("s", [common_pb2.Message(role="user", content="x", seq=9)], "seq is assigned"),
        # A transcript holds images by reference, never their bytes.
        ("s", [common_pb2.Message(role="user", content="x", images=[common_pb2.Image(data=b"\x89PNG", path=".attachments/a.png")])],
         "an image is stored by reference"),
        ("s", [common_pb2.Message(role="user", content="x", images=[common_pb2.Image(path="elsewhere/a.png")])],
         "its path must be under .attachments/"),
    ],
)
async def test_bad_appends_are_refused_and_write_nothing(memory_service, session_id, messages, expected):
    await memory_service.client.put_session("s")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await memory_service.stub.AppendMessages(
            memory_service_pb2.AppendMessagesRequest(session_id=session_id, messages=messages)
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in err.value.details()
    assert await memory_service.client.transcript("s") == []
    assert (await memory_service.client.get_session("s")).message_count == 0


async def test_append_to_unknown_session_is_not_found(memory_service):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await memory_service.stub.AppendMessages(
            memory_service_pb2.AppendMessagesRequest(session_id="ghost", messages=[user("x")])
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "PutSession" in err.value.details()


async def test_bad_session_and_paging_inputs(memory_service):
    client = memory_service.client
    with pytest.raises(InvalidArgument, match="malformed"):
        await client.put_session("../etc")
    with pytest.raises(InvalidArgument, match="namespace"):
        await client.put_session("ok", namespace="no spaces allowed")
    with pytest.raises(InvalidArgument, match="page_token"):
        await client.list_sessions(page_token="garbage")
    await client.put_session("ok")
    with pytest.raises(InvalidArgument, match="page_size"):
        await client.list_messages("ok", page_size=5000)
    with pytest.raises(InvalidArgument, match="after_seq"):
        await client.list_messages("ok", after_seq=-1)


async def test_a_second_service_on_the_same_home_is_refused_clearly(memory_service):
    from agentmesh.config import Settings
    from agentmesh.errors import FailedPrecondition
    from agentmesh.rpc.launch import start_service

    with pytest.raises(FailedPrecondition, match="in use by another process"):
        await start_service("memory", Settings.from_env(memory_service.env), "127.0.0.1:0")
    # The first one is unharmed.
    assert (await memory_service.client.put_session("still-here"))[1] is True


async def test_deleting_a_session_deletes_the_sessions_started_for_it(memory_service):
    client = memory_service.client
    await client.put_session("main")
    await client.put_session("main.sub-1", labels={"parent_session": "main"})
    await client.put_session("main.sub-1.sub-a", labels={"parent_session": "main.sub-1"})
    await client.put_session("other", labels={"parent_session": "elsewhere"})
    for session in ("main", "main.sub-1", "main.sub-1.sub-a", "other"):
        await client.append_messages(session, [user(f"in {session}")])

    assert await client.delete_session("main") is True
    for gone in ("main", "main.sub-1", "main.sub-1.sub-a"):
        with pytest.raises(NotFound):
            await client.list_messages(gone)
    assert [m.content for m in await client.transcript("other")] == ["in other"]


def calls_of(*ids: str) -> common_pb2.Message:
    return common_pb2.Message(role="assistant", run_id="r1", tool_calls=[
        common_pb2.ToolCall(call_id=i, name="shell", arguments_json="{}") for i in ids])


def result(call_id: str, text: str) -> common_pb2.Message:
    return common_pb2.Message(role="tool", content=text, tool_call_id=call_id, name="shell", run_id="r1")


async def test_a_call_gets_one_result_however_often_the_step_is_written(memory_service):
    """What a kill -9 of memory between an append's commit and its answer leaves the agent to
    do: it retries the append (it had landed), or records the call "cancelled" after a save
    whose fate it does not know. The transcript keeps the first result, and the step once."""
    client = memory_service.client
    await client.put_session("twice")
    await client.append_messages("twice", [user("go"), calls_of("c1", "c2")])
    assert await client.append_messages("twice", [calls_of("c1", "c2")]) == 2  # the assistant step again
    await client.append_messages("twice", [result("c1", "first")])
    await client.append_messages("twice", [result("c1", "first")])  # the retried append
    await memory_service.restart()  # what the service knows of the step survives a restart
    await memory_service.client.append_messages("twice", [result("c2", "second"), result("c1", "cancelled")])
    await memory_service.client.append_messages("twice", [common_pb2.Message(role="assistant", content="done")])

    messages = await memory_service.client.transcript("twice")
    assert [(m.role, m.tool_call_id, m.content) for m in messages] == [
        ("user", "", "go"), ("assistant", "", ""), ("tool", "c1", "first"), ("tool", "c2", "second"),
        ("assistant", "", "done")]


async def test_a_step_left_without_a_result_is_closed_with_an_explicit_one(memory_service):
    """The agent killed mid-step: one call answered, one not. The next turn's first message
    closes the step, and the missing result says so; a late result for it is not added after."""
    client = memory_service.client
    await client.put_session("cut")
    await client.append_messages("cut", [user("go"), calls_of("a", "b"), result("a", "done a")])
    await client.append_messages("cut", [user("again")])
    await client.append_messages("cut", [result("b", "cancelled, late")])

    messages = await client.transcript("cut")
    assert [(m.role, m.tool_call_id) for m in messages] == [
        ("user", ""), ("assistant", ""), ("tool", "a"), ("tool", "b"), ("user", "")]
    missing = messages[3]
    assert missing.name == "shell" and missing.run_id == "r1" and "no result was recorded" in missing.content
