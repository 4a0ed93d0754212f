"""Memory blocks end to end: the agent updates the `user` block from what it learns (the scripted
model calls block_append), the next session's first model call carries it in the system prompt,
a person reverts it to the previous version, and a namespace whose edits wait as drafts holds
the agent's edit until a person approves it (or drops it when rejected). Every version keeps
where it came from. All five services over real gRPC, the model a scripted HTTP server that logs
every request."""

from __future__ import annotations

import grpc

from agentmesh.v1 import learning_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error
from tests.e2e.test_auth_and_cli import run_cli
from tests.e2e.test_standing_instructions import session_in, set_part, system_of, user_memory_stub
from tests.gateway.test_error_reasons import error_info
from tests.support.llm_server import reply, tool_call

NAME = "The user's name is Ada."
UNITS = "Ada prefers metric units."
NIGHTS = "Ada works night shifts."


async def test_the_agent_keeps_the_user_block_a_person_reverts_it_and_drafts_wait(stack, llm):
    gateway = stack.gateway_stub()
    await set_part(user_memory_stub(stack), "team-a", "soul", "You are Quill.")
    for session_id in ("s1", "s2", "s3", "s4", "s5", "s6"):
        await session_in(gateway, session_id, "team-a")
    await session_in(gateway, "other", "team-b")

    # Session 1: the agent learns the user's name and writes it down.
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": NAME})), reply("Nice to meet you, Ada."))
    await chat(gateway, "s1", "Hi, I'm Ada.")
    assert llm.requests[-1].messages[-1]["content"].startswith("Block 'user' updated (version 1, 23 of 2000 characters)")
    block = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team-a", name="user"), timeout=10)
    assert (block.text, block.version, block.max_chars) == (NAME, 1, 2000)
    first = block.versions[0]
    assert (first.version, first.change, first.provenance.session_id, first.provenance.by) == (1, "append", "s1", "agent")
    assert (first.provenance.seq, first.provenance.model) == (1, "test-model")  # the user message that asked

    # Session 2: its first model call carries the block, after the standing instructions.
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": UNITS})), reply("Noted."))
    await chat(gateway, "s2", "Use metric units please.")
    prompt = system_of(llm.requests[-2])
    assert f"## user\n{NAME}" in prompt and UNITS not in prompt
    assert prompt.index("Standing instructions") < prompt.index("Memory blocks") < prompt.index("Today is")
    assert (await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team-a", name="user"))).text \
        == f"{NAME}\n{UNITS}"

    # A person reverts it to version 1: a new version (3) with version 1's text.
    reverted = await gateway.RevertBlock(learning_pb2.RevertBlockRequest(namespace="team-a", name="user", version=1))
    assert (reverted.text, reverted.version) == (NAME, 3)
    llm.add(reply("Hello Ada."))
    await chat(gateway, "s3", "Hello again.")
    prompt = system_of(llm.requests[-1])
    assert f"## user\n{NAME}" in prompt and UNITS not in prompt
    history = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team-a", name="user"))
    assert [(v.version, v.change, v.reverted_to) for v in history.versions] == [
        (3, "revert", 1), (2, "append", 0), (1, "append", 0)]

    # Drafts: the namespace's edits now wait for a person.
    policy = await gateway.SetBlockPolicy(learning_pb2.BlockPolicy(namespace="team-a", edits="draft"))
    assert policy.edits == "draft"
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": NIGHTS})), reply("Got it."))
    await chat(gateway, "s4", "I work nights.")
    assert "kept as draft" in llm.requests[-1].messages[-1]["content"]
    listed = await gateway.ListBlocks(learning_pb2.ListBlocksRequest(namespace="team-a"))
    assert listed.edits == "draft" and [b.text for b in listed.blocks] == [NAME]
    (draft,) = listed.drafts
    assert (draft.name, draft.change, draft.proposed, draft.provenance.session_id) == (
        "user", "append", f"{NAME}\n{NIGHTS}", "s4")
    llm.add(reply("Hi."))
    await chat(gateway, "s5", "Hi.")
    assert NIGHTS not in system_of(llm.requests[-1])  # held: not shown before approval

    approved = await gateway.ApproveBlockEdit(learning_pb2.BlockEditRef(namespace="team-a", draft_id=draft.id))
    assert (approved.text, approved.version) == (f"{NAME}\n{NIGHTS}", 4)
    llm.add(reply("Hi."))
    await chat(gateway, "s6", "Hi.")
    assert f"## user\n{NAME}\n{NIGHTS}" in system_of(llm.requests[-1])
    assert (await gateway.ListBlocks(learning_pb2.ListBlocksRequest(namespace="team-a"))).drafts == []

    # A person does the same from the command line.
    code, out, err = await run_cli(stack, "memory", "blocks", "show", "user", "--namespace", "team-a")
    assert code == 0, err
    assert out.splitlines()[0] == f"user  v4  {len(NAME) + 1 + len(NIGHTS)}/2000 chars"
    assert "v3  " in out and "revert to v1" in out and "(agent, session s1 #1, test-model)" in out
    code, out, err = await run_cli(stack, "memory", "blocks", "revert", "user", "1", "--namespace", "team-a")
    assert (code, out.strip()) == (0, "user is now v5 (the text of v1)"), err
    code, out, err = await run_cli(stack, "memory", "blocks", "list", "--namespace", "team-a")
    assert code == 0 and "edits: draft   0 waiting" in out and NIGHTS not in out
    code, out, err = await run_cli(stack, "memory", "blocks", "approve", "bd-nothing", "--namespace", "team-a")
    assert code == 1 and "has no block draft 'bd-nothing'" in err

    # Another namespace never sees them.
    llm.add(reply("Hi."))
    await chat(gateway, "other", "Hi.")
    assert NAME not in system_of(llm.requests[-1]) and "Memory blocks" not in system_of(llm.requests[-1])


async def test_block_edits_that_cannot_apply_are_refused_with_a_reason_and_change_nothing(stack, llm):
    gateway = stack.gateway_stub()
    await session_in(gateway, "s1", "team-a")
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": NAME})),
            reply("", tool_call("block_replace", {"name": "user", "old": "Bob", "new": "Rob"})),
            reply("", tool_call("block_append", {"name": "user", "text": "x" * 1990})),
            reply("Done."))
    events = await chat(gateway, "s1", "Remember me.")
    assert of_kind(events, "run_finished")[0].final_text == "Done."
    tool_results = [m["content"] for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert tool_results[1] == ("error: block_replace failed: block 'user' does not contain the text to replace; "
                               "read the block in the system prompt and quote it exactly")
    assert tool_results[2].startswith("error: block_append failed: block 'user' would hold 2014 characters; "
                                      "the limit is 2000")
    block = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team-a", name="user"))
    assert (block.text, block.version) == (NAME, 1)

    missing = await rpc_error(gateway.RevertBlock(learning_pb2.RevertBlockRequest(namespace="team-a", name="user",
                                                                                  version=9), timeout=10))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert missing.details() == "block 'user' of namespace 'team-a' has no version 9; GetBlock lists its versions"
    assert error_info(missing).reason == "BLOCK_VERSION_NOT_FOUND"
    no_draft = await rpc_error(gateway.ApproveBlockEdit(learning_pb2.BlockEditRef(namespace="team-a", draft_id="bd-x")))
    assert no_draft.code() == grpc.StatusCode.NOT_FOUND and error_info(no_draft).reason == "BLOCK_DRAFT_NOT_FOUND"
    bad_policy = await rpc_error(gateway.SetBlockPolicy(learning_pb2.BlockPolicy(namespace="team-a", edits="maybe")))
    assert bad_policy.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_policy.details().startswith("edits 'maybe' is unknown")
    bad_name = await rpc_error(gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team-a", name="User!")))
    assert bad_name.code() == grpc.StatusCode.INVALID_ARGUMENT
    unknown = await rpc_error(gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team-a", name="project")))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    # Nothing of that changed the block or its history.
    after = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team-a", name="user"))
    assert (after.text, after.version, len(after.versions)) == (NAME, 1, 1)
    assert (await gateway.ListBlocks(learning_pb2.ListBlocksRequest(namespace="team-a"))).edits == "apply"
