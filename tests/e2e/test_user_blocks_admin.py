"""Another person's `user` block, under a tenant policy (docs/memory.md#per-user-blocks): an admin
of the namespace lists every person's, reads, writes and reverts one — by gRPC, HTTP and the CLI —
and each such call is an audit line naming the person; a member can do none of it and changes
nothing. The person's next session carries what the admin left. All five services over real
gRPC, people signed in with their own service-account tokens."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest

from agentmesh.tenancy import token_digest
from agentmesh.v1 import gateway_pb2, learning_pb2
from tests.e2e.conftest import collect, rpc_error
from tests.e2e.test_standing_instructions import system_of
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack

TOKENS = {"boss": "tok-boss-0123456789abcdef", "alice": "tok-alice-0123456789abcdef",
          "bob": "tok-bob-0123456789abcdefgh"}
ROLES = {"boss": "admin", "alice": "member", "bob": "member"}
ALICE = "service-account:alice"
OWLS = "Alice keeps owls."
TWO = "Alice keeps two owls."


def auth(who: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[who]}"),)


@pytest.fixture
async def stack(tmp_path: Path, llm):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "tenants": {"acme": {"namespaces": ["team", "team2"]}},
        "service_accounts": [{"name": who, "token_sha256": token_digest(token), "tenant": "acme", "role": ROLES[who]}
                             for who, token in TOKENS.items()]}))
    env = {"AGENTMESH_AUTH_POLICY": str(policy), "AGENTMESH_AUDIT_LOG": str(tmp_path / "audit.jsonl")}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def chat_as(gateway, who: str, session_id: str, message: str, namespace: str = "team") -> None:
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id, namespace=namespace),
                                metadata=auth(who), timeout=10)
    await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id=session_id, message=message),
                               metadata=auth(who), timeout=60))


async def _cli(stack: Stack, who: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update({f"AGENTMESH_{n.upper()}_ADDR": a for n, a in stack.addresses.items()})
    env.update({"AGENTMESH_HOME": stack.env["AGENTMESH_HOME"], "AGENTMESH_AUTH_TOKEN": TOKENS[who]})
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentmesh.cli.main", *args],
                                   env=env, capture_output=True, text=True, timeout=120)


def _audited(stack: Stack) -> list[tuple[str, str, str, str]]:
    path = Path(stack.env["AGENTMESH_AUDIT_LOG"])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [(e["method"], e["principal"], e["user"], e.get("block", "")) for e in lines
            if e.get("action") == "block.other_user"]


async def test_an_admin_reads_writes_and_reverts_another_persons_user_block_and_a_member_cannot(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": OWLS})), reply("Noted."))
    await chat_as(gateway, "alice", "a1", "I keep owls.")
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": "Bob rides bikes."})), reply("Hi Bob."))
    await chat_as(gateway, "bob", "b1", "I ride bikes.")

    # A member: neither another's block nor the list of everyone's, by any door; nothing changes.
    for call in (gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team", name="user", user=ALICE),
                                  metadata=auth("bob")),
                 gateway.ListBlocks(learning_pb2.ListBlocksRequest(namespace="team", all_users=True),
                                    metadata=auth("bob")),
                 gateway.SetBlock(learning_pb2.SetBlockRequest(namespace="team", name="user", text="Alice hates owls.",
                                                               user=ALICE), metadata=auth("bob")),
                 gateway.RevertBlock(learning_pb2.RevertBlockRequest(namespace="team", name="user", version=1,
                                                                     user=ALICE), metadata=auth("bob"))):
        err = await rpc_error(call)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "admin" in err.details(), err.details()
    refused = await _cli(stack, "bob", "memory", "blocks", "show", "user", "--namespace", "team", "--user", ALICE)
    assert refused.returncode != 0 and "admin" in refused.stderr
    assert _audited(stack) == []
    mine = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team", name="user"), metadata=auth("alice"))
    assert (mine.text, mine.version) == (OWLS, 1)

    # The admin: every person's user block, each with whose it is.
    listed = await gateway.ListBlocks(learning_pb2.ListBlocksRequest(namespace="team", all_users=True),
                                      metadata=auth("boss"))
    assert sorted((b.name, b.user, b.text) for b in listed.blocks) == [
        ("user", ALICE, OWLS), ("user", "service-account:bob", "Bob rides bikes.")]
    read = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team", name="user", user=ALICE),
                                  metadata=auth("boss"))
    assert (read.text, read.user, [v.provenance.by for v in read.versions]) == (OWLS, ALICE, ["agent"])
    # Writes it over HTTP (a new version, by the admin), reverts it by the CLI, reads it by the CLI.
    async with httpx.AsyncClient(base_url=stack.http_url, headers={"authorization": f"Bearer {TOKENS['boss']}"}) as http:
        written = await http.put("/v1/namespaces/team/blocks/user", json={"text": TWO, "user": ALICE})
        assert written.status_code == 200, written.text
        assert (written.json()["text"], written.json()["version"]) == (TWO, "2")
        shown = await http.get("/v1/namespaces/team/blocks/user", params={"user": ALICE})
        assert shown.json()["versions"][0]["provenance"]["by"] == "service-account:boss"
        assert shown.json()["versions"][0]["change"] == "set"
        bad = await http.put("/v1/namespaces/team/blocks/project", json={"text": "x", "user": ALICE})
        assert bad.status_code == 400 and "not a person's" in bad.text
    llm.add(reply("Hello Alice."))
    await chat_as(gateway, "alice", "a2", "Hello.")
    assert f"## user\n{TWO}" in system_of(llm.requests[-1])
    reverted = await _cli(stack, "boss", "memory", "blocks", "revert", "user", "1", "--namespace", "team",
                          "--user", ALICE)
    assert reverted.returncode == 0, reverted.stderr
    shown = await _cli(stack, "boss", "memory", "blocks", "show", "user", "--namespace", "team", "--user", ALICE)
    assert shown.returncode == 0 and shown.stdout.splitlines()[1].strip() == OWLS, shown.stdout
    llm.add(reply("Hello again, Alice."))
    await chat_as(gateway, "alice", "a3", "Hello.")
    prompt = system_of(llm.requests[-1])
    assert f"## user\n{OWLS}" in prompt and TWO not in prompt
    # Bob's block is untouched; the admin's own is not Alice's.
    bobs = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team", name="user"), metadata=auth("bob"))
    assert (bobs.text, bobs.version) == ("Bob rides bikes.", 1)

    # With edits held as drafts, Alice's agent proposes two; Bob cannot decide them, the admin
    # sees them among everyone's and approves one (CLI), rejects the other (gRPC).
    await gateway.SetBlockPolicy(learning_pb2.BlockPolicy(namespace="team", edits="draft"), metadata=auth("boss"))
    llm.add(reply("", tool_call("block_append", {"name": "user", "text": "Alice likes tea."})),
            reply("", tool_call("block_append", {"name": "user", "text": "Alice hates tea."})), reply("Noted."))
    await chat_as(gateway, "alice", "a4", "Tea?")
    everyone = await gateway.ListBlocks(learning_pb2.ListBlocksRequest(namespace="team", all_users=True),
                                        metadata=auth("boss"))
    likes, hates = everyone.drafts
    assert (likes.user, likes.text, hates.text) == (ALICE, "Alice likes tea.", "Alice hates tea.")
    err = await rpc_error(gateway.ApproveBlockEdit(learning_pb2.BlockEditRef(namespace="team", draft_id=likes.id,
                                                                             user=ALICE), metadata=auth("bob")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    approved = await _cli(stack, "boss", "memory", "blocks", "approve", likes.id, "--namespace", "team", "--user", ALICE)
    assert approved.returncode == 0, approved.stderr
    await gateway.RejectBlockEdit(learning_pb2.BlockEditRef(namespace="team", draft_id=hates.id, user=ALICE),
                                  metadata=auth("boss"))
    mine = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team", name="user"), metadata=auth("alice"))
    assert (mine.text, list(mine.drafts)) == (f"{OWLS}\nAlice likes tea.", [])

    # A subject no person has: refused with a sentence, nothing written or audited.
    err = await rpc_error(gateway.SetBlock(learning_pb2.SetBlockRequest(
        namespace="team", name="user", text="x", user="user:" + "z" * 300), metadata=auth("boss")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 256 characters" in err.details()

    # Each call on another person's block is one audit line, naming the admin and the person.
    boss = "service-account:boss"
    assert _audited(stack) == [
        ("memory.ListBlocks", boss, "*", ""), ("memory.GetBlock", boss, ALICE, "user"),
        ("memory.SetBlock", boss, ALICE, "user"), ("memory.GetBlock", boss, ALICE, "user"),
        ("memory.RevertBlock", boss, ALICE, "user"), ("memory.GetBlock", boss, ALICE, "user"),
        ("memory.ListBlocks", boss, "*", ""), ("memory.ApproveBlockEdit", boss, ALICE, ""),
        ("memory.RejectBlockEdit", boss, ALICE, "")]

    # The namespace exported and imported (the admin's CLI): each person's block moves with its
    # history and stays theirs — Alice's next session there carries hers, Bob's his.
    # (No sessions: this home holds them already, and session ids are the home's.)
    exported = await _cli(stack, "boss", "export", "team", "--sessions", "none-of-them")
    assert exported.returncode == 0, exported.stderr
    blocks = [json.loads(line) for line in exported.stdout.splitlines() if '"kind": "block"' in line]
    assert sorted((b["user"], len(b["versions"])) for b in blocks) == [(ALICE, 4), ("service-account:bob", 1)]
    path = Path(stack.env["AGENTMESH_HOME"]) / "team.jsonl"
    path.write_text(exported.stdout)
    imported = await _cli(stack, "boss", "import", str(path), "--namespace", "team2")
    assert imported.returncode == 0, imported.stderr
    llm.add(reply("Hello in team2."))
    await chat_as(gateway, "alice", "a5", "Hello.", namespace="team2")
    prompt = system_of(llm.requests[-1])
    assert f"## user\n{OWLS}\nAlice likes tea." in prompt and "Bob rides bikes." not in prompt
    moved = await gateway.GetBlock(learning_pb2.GetBlockRequest(namespace="team2", name="user"), metadata=auth("alice"))
    assert [v.change for v in moved.versions] == ["append", "revert", "set", "append"]
