"""Recall over conversations and memory blocks over HTTP, routed from their google.api.http
options like every other route: a search with its filters, the blocks read, a policy set, a
revert refused with its reason."""

from __future__ import annotations

from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2, sessions_pb2


async def test_conversations_are_searched_and_blocks_read_over_http(stack, http):
    memory = stack.memory_stub()
    await memory.PutSession(memory_service_pb2.PutSessionRequest(
        session=sessions_pb2.Session(session_id="s1", namespace="team-a")), timeout=10)
    await memory.AppendMessages(memory_service_pb2.AppendMessagesRequest(session_id="s1", messages=[
        common_pb2.Message(role="user", content="Our release train leaves on Thursdays."),
        common_pb2.Message(role="assistant", content="Thursdays it is."),
    ]), timeout=10)

    found = await http.post("/v1/namespaces/team-a/conversations/search",
                            json={"query": "when does the release train leave", "role": "user"})
    assert found.status_code == 200, found.text
    hit = found.json()["hits"][0]
    assert (hit["session_id"], hit["seq"], hit["role"]) == ("s1", "1", "user")
    assert hit["after"]["content"] == "Thursdays it is."
    assert (await http.post("/v1/namespaces/team-b/conversations/search", json={"query": "release train"})).json() \
        .get("hits", []) == []
    empty = await http.post("/v1/namespaces/team-a/conversations/search", json={"query": ""})
    assert empty.status_code == 400 and empty.json()["error"]["message"] == "query is empty: say what to look for"

    assert (await http.get("/v1/namespaces/team-a/blocks")).json() == {"blocks": [], "drafts": [], "edits": "apply"}
    policy = await http.put("/v1/namespaces/team-a/block-policy", json={"edits": "draft"})
    assert policy.status_code == 200 and policy.json()["edits"] == "draft"
    missing = await http.get("/v1/namespaces/team-a/blocks/user")
    assert missing.status_code == 404
    revert = await http.post("/v1/namespaces/team-a/blocks/user/revert", json={"version": 1})
    assert revert.status_code == 404 and revert.json()["error"]["reason"] == "BLOCK_VERSION_NOT_FOUND"
    rejected = await http.post("/v1/namespaces/team-a/block-drafts/bd-none/reject", json={})
    assert rejected.status_code == 404 and rejected.json()["error"]["reason"] == "BLOCK_DRAFT_NOT_FOUND"
