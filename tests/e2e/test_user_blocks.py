"""Per-user memory blocks end to end (docs/memory.md#per-user-blocks): with sign-in, the `user`
block is each person's own. Alice's agent writes hers; Bob's sessions in the same namespace never
carry it in any model call (the scripted model server's recorded requests), while the
namespace's blocks reach both; Alice's next session does carry it; erasing Alice removes it. All
five services over real gRPC, two people signed in with their own tokens."""

from __future__ import annotations

import pytest

from agentmesh.tenancy import token_digest
from agentmesh.v1 import gateway_pb2, learning_pb2, sessions_pb2
from tests.e2e.conftest import collect
from tests.e2e.test_standing_instructions import system_of
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack

TOKENS = {"alice": "tok-alice-0123456789abcdef", "bob": "tok-bob-0123456789abcdefgh"}
OWLS = "Alice keeps owls."
CALM = "This team prefers calm answers."


def auth(who: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[who]}"),)


def subject(who: str) -> str:
    return f"user:{token_digest(TOKENS[who])[:12]}"


@pytest.fixture
async def stack(tmp_path, llm):
    env = {"AGENTMESH_AUTH_TOKENS": ",".join(TOKENS.values())}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def chat_as(gateway, who: str, session_id: str, message: str) -> None:
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id, namespace="team"),
                                metadata=auth(who), timeout=10)
    await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id=session_id, message=message),
                               metadata=auth(who), timeout=60))


async def test_one_persons_user_block_never_reaches_anothers_prompt(stack, llm):
    gateway = stack.gateway_stub()
    # Alice's turn: the agent writes the `user` block (hers) and the `project` block (the team's).
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": OWLS})),
            reply("", tool_call("block_append", {"name": "project", "text": CALM})), reply("Noted."))
    await chat_as(gateway, "alice", "a1", "I keep owls.")
    seen_by_alice = len(llm.requests)

    # Bob's sessions: the team's block, never Alice's; nor do his edits touch hers.
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": "Bob rides bikes."})), reply("Hi Bob."))
    await chat_as(gateway, "bob", "b1", "Hi, I'm Bob and I ride bikes.")
    bobs = llm.requests[seen_by_alice:]
    assert bobs and all(OWLS not in str(r.body) for r in bobs)
    assert f"## project\n{CALM}" in system_of(bobs[0])
    assert "## user" not in system_of(bobs[0])
    llm.add(reply("Hello again."))
    await chat_as(gateway, "bob", "b2", "Hello.")
    assert OWLS not in system_of(llm.requests[-1]) and "## user\nBob rides bikes." in system_of(llm.requests[-1])

    # Alice's next session carries hers (not Bob's), after the namespace's in the fixed order.
    llm.add(reply("Hello Alice."))
    await chat_as(gateway, "alice", "a2", "Hello.")
    prompt = system_of(llm.requests[-1])
    assert f"## user\n{OWLS}" in prompt and "Bob rides bikes." not in prompt
    assert prompt.index("## user") < prompt.index("## project")

    # Reading the blocks shows each person their own.
    mine = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team", name="user"), metadata=auth("alice"))
    theirs = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team", name="user"), metadata=auth("bob"))
    assert (mine.text, mine.version, theirs.text) == (OWLS, 1, "Bob rides bikes.")

    # Erasing Alice removes her block; Bob's and the team's stay.
    await gateway.EraseUser(sessions_pb2.EraseUserRequest(namespace="team", user=subject("alice")),
                            metadata=auth("bob"), timeout=30)
    llm.add(reply("Hello."))
    await chat_as(gateway, "alice", "a3", "Hello.")
    prompt = system_of(llm.requests[-1])
    assert OWLS not in prompt and f"## project\n{CALM}" in prompt and "## user" not in prompt
    listed = await gateway.ListBlocks(learning_pb2.ListBlocksRequest(namespace="team"), metadata=auth("bob"))
    assert [(b.name, b.text) for b in listed.blocks] == [("user", "Bob rides bikes."), ("project", CALM)]
