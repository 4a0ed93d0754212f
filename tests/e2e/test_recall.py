"""Recall over conversations end to end: the agent's `conversation_search` finds what a user said
sessions ago in the same namespace and nothing of another namespace or tenant; the Gateway's
SearchConversations answers the same, with each hit's neighbours; messages acknowledged while the
index was off are indexed from the transcripts on the next start (the watermark). All five
services over real gRPC with a policy of two tenants, the model a scripted HTTP server."""

from __future__ import annotations

import grpc

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2, gateway_pb2, learning_pb2, sessions_pb2
from tests.e2e.conftest import collect, of_kind, rpc_error
from tests.e2e.test_auth_and_cli import run_cli
from tests.e2e.test_tenants import auth, tenants  # noqa: F401 - the fixture
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack


async def chat_as(gateway, who: str, session_id: str, message: str) -> list:
    request = gateway_pb2.ChatRequest(session_id=session_id, message=message)
    return await collect(gateway.Chat(request, metadata=auth(who), timeout=60))


async def open_session(gateway, who: str, session_id: str, namespace: str) -> None:
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id, namespace=namespace),
                                metadata=auth(who), timeout=10)


def search(namespace: str, query: str, **filters) -> learning_pb2.SearchConversationsRequest:
    return learning_pb2.SearchConversationsRequest(namespace=namespace, query=query, **filters)


async def test_conversation_search_finds_a_fact_from_three_sessions_ago_in_its_namespace_only(tenants, llm):  # noqa: F811
    stack, _ = tenants
    gateway = stack.gateway_stub()
    for who, session_id, namespace in (("a-member", "a-1", "acme"), ("a-member", "a-2", "acme"),
                                       ("a-member", "a-3", "acme"), ("a-member", "a-4", "acme"),
                                       ("b-member", "b-1", "beta")):
        await open_session(gateway, who, session_id, namespace)
    llm.add(reply("Noted: Biscuit."), reply("Hello!"), reply("It is sunny."), reply("Noted: Rex."))
    await chat_as(gateway, "a-member", "a-1", "By the way, my dog is called Biscuit and she is a beagle.")
    await chat_as(gateway, "a-member", "a-2", "Hello there, how are you?")
    await chat_as(gateway, "a-member", "a-3", "What is the weather like today?")
    # Another tenant says the same kind of thing: it must never be found from acme.
    await chat_as(gateway, "b-member", "b-1", "My dog is called Rex and he is a beagle too.")

    llm.add(reply("", tool_call("conversation_search", {"query": "what is my dog called", "role": "user"})),
            reply("Your dog is called Biscuit."))
    events = await chat_as(gateway, "a-member", "a-4", "Remind me, what is my dog called?")
    assert of_kind(events, "run_finished")[0].final_text == "Your dog is called Biscuit."
    found = llm.requests[-1].messages[-1]
    assert found["role"] == "tool"
    assert "session a-1, message 1 (user" in found["content"] and "Biscuit" in found["content"]
    assert "after: assistant: Noted: Biscuit." in found["content"]
    assert "Rex" not in found["content"]

    # The Gateway's RPC answers the same, with each hit linked to its message and its neighbours.
    answer = await gateway.SearchConversations(search("acme", "dog beagle"), metadata=auth("a-member"),
                                               timeout=10)
    first = answer.hits[0]
    assert (first.session_id, first.seq, first.role) == ("a-1", 1, "user") and "Biscuit" in first.text
    assert not first.HasField("before") and first.after.content == "Noted: Biscuit." and first.after.seq == 2
    assert all("Rex" not in h.text for h in answer.hits)
    # Filters: a session, a role, a time range.
    only_a3 = await gateway.SearchConversations(search("acme", "weather", session_id="a-3"), metadata=auth("a-member"))
    assert {h.session_id for h in only_a3.hits} == {"a-3"}
    replies = await gateway.SearchConversations(search("acme", "Biscuit", role="assistant"), metadata=auth("a-member"))
    assert [(h.session_id, h.role) for h in replies.hits][:1] == [("a-1", "assistant")]
    assert all(h.role == "assistant" for h in replies.hits)
    later = await gateway.SearchConversations(search("acme", "Biscuit", since=first.created_at + 3600),
                                              metadata=auth("a-member"))
    assert list(later.hits) == []

    # Tenant B finds its own and nothing of A's; A cannot search B's namespace at all.
    theirs = await gateway.SearchConversations(search("beta", "dog"), metadata=auth("b-member"))
    assert theirs.hits and all(h.session_id == "b-1" for h in theirs.hits)
    refused = await rpc_error(gateway.SearchConversations(search("beta", "dog"), metadata=auth("a-member"), timeout=10))
    assert refused.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)

    # Bad input: the right status and a sentence.
    empty = await rpc_error(gateway.SearchConversations(search("acme", "  "), metadata=auth("a-member"), timeout=10))
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert empty.details() == "query is empty: say what to look for"
    role = await rpc_error(gateway.SearchConversations(search("acme", "dog", role="tool"), metadata=auth("a-member")))
    assert role.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert role.details() == "role 'tool' is not one the index keeps: use user or assistant"
    backwards = await rpc_error(gateway.SearchConversations(search("acme", "dog", since=20, until=10),
                                                            metadata=auth("a-member")))
    assert backwards.details() == "since must be earlier than until"


async def test_messages_acknowledged_before_a_crash_are_indexed_on_the_next_start(tmp_path, llm):
    home = tmp_path / "home"
    # The index off stands for a crash between the append's ack and its indexing: the transcript
    # has the messages, the watermark does not.
    async with Stack(home, llm_base_url=llm.base_url, env={"AGENTMESH_CONVERSATION_INDEX": "false"}) as stack:
        memory = stack.memory_stub()
        await memory.PutSession(memory_service_pb2.PutSessionRequest(
            session=sessions_pb2.Session(session_id="old", namespace="team-a")), timeout=10)
        await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(session_id="old", messages=[
            common_pb2.Message(role="user", content="The launch code word is marmalade."),
            common_pb2.Message(role="assistant", content="Understood."),
        ]), timeout=10)
    async with Stack(home, llm_base_url=llm.base_url) as stack:
        answer = await stack.gateway_stub().SearchConversations(search("team-a", "launch code word"), timeout=10)
        assert [(h.session_id, h.seq) for h in answer.hits][:1] == [("old", 1)]
        assert answer.hits[0].after.content == "Understood."

        # The same from the command line, filters included; a bad time is a usage error.
        code, out, err = await run_cli(stack, "sessions", "search", "launch code word", "--namespace", "team-a",
                                       "--role", "user", "--since", "2020-01-01")
        assert code == 0, err
        assert out.splitlines()[0].startswith("old #1  user  ")
        assert "    The launch code word is marmalade." in out and "    after: assistant: Understood." in out
        code, out, err = await run_cli(stack, "sessions", "search", "x", "--since", "yesterday")
        assert code == 2 and "--since 'yesterday' is not an ISO 8601 date or time" in err
