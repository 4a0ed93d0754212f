"""`agentmesh export` and `agentmesh import` through the real stack (docs/memory.md#export-and-
import): a namespace exported from one home and imported into a fresh one answers as before —
the scripted model server logs the requests, and the imported standing instructions and the
recalled memory reach the model, as do the memory blocks, which keep their versions — and the
import's refusals change nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.v1 import agents_pb2, common_pb2, gateway_pb2, learning_pb2, sessions_pb2
from tests.support.identities import signed_channel
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import collect

SOUL = "You are Captain Zebra, who answers in nautical terms."
FACT = "The launch code word for the crew is PELICAN."
LONG = 2100
CAPTAIN = "The captain's name is Ada."
KNOTS = 'def knots(speed_kmh: float) -> float:\n    """Convert km/h to knots."""\n    return speed_kmh / 1.852\n'
LISBON, PORTO = "The crew sails to Lisbon.", "The crew sails to Porto."


async def agentmesh(stack: Stack, *args: str, stdout=None) -> subprocess.CompletedProcess:
    """The command in a child process, run off the event loop the services are served on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update({f"AGENTMESH_{name.upper()}_ADDR": address for name, address in stack.addresses.items()})
    env["AGENTMESH_HOME"] = stack.env["AGENTMESH_HOME"]
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "agentmesh.cli.main", *args], env=env, text=True,
        stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)


async def _chat(stack: Stack, session_id: str, namespace: str, message: str) -> None:
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id=session_id, namespace=namespace))
    await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id=session_id, message=message)))


def _system_text(request) -> str:
    return "\n".join(str(m.get("content")) for m in request.body["messages"])


async def test_an_exported_namespace_answers_from_its_memories_and_instructions_in_a_fresh_home(tmp_path):
    export = tmp_path / "crew.jsonl"
    with ScriptedLLMServer(default=reply("Aye.")) as llm:
        async with Stack(tmp_path / "a", llm_base_url=llm.base_url) as stack:
            gateway = stack.gateway_stub()
            await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="crew", part="soul", text=SOUL))
            await stack.memory_stub().Remember(memory_service_pb2.RememberRequest(namespace="crew", text=FACT, kind="fact"))
            await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
                namespace="crew", retention=sessions_pb2.Retention(usage_days=90)))
            # The agent writes two blocks in the first turn; a person then rewrites one.
            llm.add(reply("", tool_call("block_append", {"name": "user", "text": CAPTAIN})),
                    reply("", tool_call("block_append", {"name": "project", "text": LISBON})))
            await _chat(stack, "voyage-1", "crew", "Ahoy, who are you?")
            await gateway.SetBlock(learning_pb2.SetBlockRequest(namespace="crew", name="project", text=PORTO))
            # A self-made tool, as the agent promotes one (the file's schema is a lie the import
            # does not keep: it derives the schema from the source again).
            agent = signed_channel(stack.settings.keys_dir, "agent", "memory", stack.addresses["memory"])
            await memory_service_pb2_grpc.MemoryStub(agent).PutPromotedTool(learning_pb2.PromotedTool(
                namespace="crew", name="knots", description="Anything.", function="knots", source=KNOTS,
                parameters_json=json.dumps({"type": "object", "properties": {"command": {"type": "string"}}})))
            await agent.close()
            # A named agent with two versions.
            await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="crew", spec=agents_pb2.AgentSpec(
                name="bosun", description="Keeps the deck.", instructions="You are the bosun.")))
            await gateway.UpdateAgent(agents_pb2.UpdateAgentRequest(namespace="crew", spec=agents_pb2.AgentSpec(
                name="bosun", description="Keeps the deck.", instructions="You are the bosun; be brief.")))
            # A log longer than one RestoreSession batch (1000 messages).
            log = [common_pb2.Message(role="user" if i % 2 == 0 else "assistant", content=f"log entry {i}")
                   for i in range(LONG)]
            restore = memory_service_pb2_grpc.MemoryStub(stack.user_channel("memory")).RestoreSession
            for first in range(0, LONG, 1000):
                await restore(memory_service_pb2.RestoreSessionRequest(
                    session=sessions_pb2.Session(session_id="logbook", namespace="crew"),
                    messages=log[first:first + 1000], continues=first > 0))
            with export.open("w") as out:
                done = await agentmesh(stack, "export", "crew", stdout=out)
            assert done.returncode == 0, done.stderr
            assert "exported crew:" in done.stderr

        lines = [json.loads(line) for line in export.read_text().splitlines()]
        assert lines[0]["embedder"]["name"] == "hashing-v1"
        assert lines[-1]["kind"] == "end"
        assert lines[0]["format"] == "agentmesh-export/3"
        assert {r["kind"] for r in lines[1:]} >= {"settings", "profile", "agent", "memory", "session", "block",
                                                  "block_policy"}
        (agent,) = [r for r in lines if r.get("kind") == "agent"]
        assert (agent["name"], [v["version"] for v in agent["versions"]]) == ("bosun", [1, 2])

        async with Stack(tmp_path / "b", llm_base_url=llm.base_url) as stack:
            done = await agentmesh(stack, "import", str(export), "--namespace", "crew2")
            assert done.returncode == 0, done.stderr
            transcript = await stack.gateway_stub().GetTranscript(sessions_pb2.GetTranscriptRequest(session_id="voyage-1"))
            assert [m.content for m in transcript.messages if m.role in ("user", "assistant") and m.content] == \
                ["Ahoy, who are you?", "Aye."]
            contents, after = [], 0
            while True:
                page = await stack.gateway_stub().GetTranscript(sessions_pb2.GetTranscriptRequest(
                    session_id="logbook", page_size=1000, after_seq=after))
                contents += [m.content for m in page.messages]
                if not page.next_after_seq:
                    break
                after = page.next_after_seq
            assert contents == [f"log entry {i}" for i in range(LONG)]
            settings = await stack.gateway_stub().GetNamespaceSettings(
                sessions_pb2.GetNamespaceSettingsRequest(namespace="crew2"))
            assert settings.retention.usage_days == 90
            versions = await stack.gateway_stub().ListAgentVersions(agents_pb2.ListAgentVersionsRequest(
                namespace="crew2", name="bosun"))
            assert [(v.version, v.spec.instructions) for v in versions.versions] == [
                (1, "You are the bosun."), (2, "You are the bosun; be brief.")]

            # The imported conversations are searchable in the new namespace (recall over them).
            recalled = await stack.gateway_stub().SearchConversations(learning_pb2.SearchConversationsRequest(
                namespace="crew2", query="Ahoy", k=5))
            assert ("voyage-1", "Ahoy, who are you?") in [(h.session_id, h.text) for h in recalled.hits]
            project = await stack.gateway_stub().GetBlock(learning_pb2.GetBlockRequest(namespace="crew2", name="project"))
            assert [(v.version, v.change, v.text, v.provenance.session_id) for v in project.versions] == [
                (2, "set", PORTO, ""), (1, "append", LISBON, "voyage-1")]

            before = len(llm.requests)
            await _chat(stack, "voyage-2", "crew2", "What is the launch code word?")
            asked = _system_text(llm.requests[before])
            assert SOUL in asked  # the imported standing instructions
            assert "PELICAN" in asked  # the imported memory, recalled for this question
            assert f"## user\n{CAPTAIN}" in asked and f"## project\n{PORTO}" in asked  # the imported blocks
            (knots,) = [t["function"] for t in llm.requests[before].body["tools"] if t["function"]["name"] == "knots"]
            assert knots["description"] == "Convert km/h to knots."  # the imported self-made tool, as derived
            assert list(knots["parameters"]["properties"]) == ["speed_kmh"]

            # Again without --replace: refused in a sentence, nothing written.
            again = await agentmesh(stack, "import", str(export), "--namespace", "crew2")
            assert again.returncode == 1
            assert ("namespace 'crew2' already holds memories, standing instructions, memory blocks, "
                    "self-made tools, settings, agents (bosun)"
                    in again.stderr)
            assert "nothing was imported" in again.stderr
            # With --replace it goes through (the same records written over).
            replaced = await agentmesh(stack, "import", str(export), "--namespace", "crew2", "--replace")
            assert replaced.returncode == 0, replaced.stderr
            versions = await stack.gateway_stub().ListAgentVersions(agents_pb2.ListAgentVersionsRequest(
                namespace="crew2", name="bosun"))
            assert [v.version for v in versions.versions] == [1, 2]  # made again, not stacked on top
            project = await stack.gateway_stub().GetBlock(learning_pb2.GetBlockRequest(namespace="crew2", name="project"))
            assert [v.version for v in project.versions] == [2, 1]  # written over, not stacked on top

            # A file from a newer format, and a cut-off file: refused before anything is sent.
            newer = tmp_path / "newer.jsonl"
            newer.write_text(json.dumps({"format": "agentmesh-export/4"}) + "\n" + json.dumps({"kind": "end"}) + "\n")
            refused = await agentmesh(stack, "import", str(newer), "--namespace", "crew3")
            assert refused.returncode == 2
            assert "newer than this agentmesh reads (agentmesh-export/3)" in refused.stderr
            cut = tmp_path / "cut.jsonl"
            cut.write_text("\n".join(export.read_text().splitlines()[:-1]) + "\n")
            refused = await agentmesh(stack, "import", str(cut), "--namespace", "crew3")
            assert refused.returncode == 2 and "was cut off" in refused.stderr
            listed = await stack.memory_stub().ListMemories(memory_service_pb2.ListMemoriesRequest(namespace="crew3"))
            assert list(listed.memories) == []


async def _vectors(stack: Stack, namespace: str) -> dict[str, list[float]]:
    listed = await stack.memory_stub().ListMemories(memory_service_pb2.ListMemoriesRequest(
        namespace=namespace, page_size=100, with_vectors=True))
    return {m.text: list(m.vector) for m in listed.memories}


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-5 for x, y in zip(a, b, strict=True))


async def test_memories_move_with_their_vectors_unless_exported_as_text_or_of_another_embedder(tmp_path):
    from agentmesh.cli.export import pack_vector, unpack_vector

    with_vectors, as_text = tmp_path / "v.jsonl", tmp_path / "t.jsonl"
    async with Stack(tmp_path / "a") as stack:
        for text in (FACT, "The ship's cat is called Marmalade."):
            await stack.memory_stub().Remember(memory_service_pb2.RememberRequest(namespace="crew", text=text))
        original = await _vectors(stack, "crew")
        for path, flags in ((with_vectors, ()), (as_text, ("--text",))):
            with path.open("w") as out:
                done = await agentmesh(stack, "export", "crew", *flags, stdout=out)
            assert done.returncode == 0, done.stderr

    lines = [json.loads(line) for line in with_vectors.read_text().splitlines()]
    assert (lines[0]["embedder"]["id"], lines[0]["vectors"]) == ("hashing-v1:512", True)
    memories = [r for r in lines if r.get("kind") == "memory"]
    assert all(_close(unpack_vector(r["vector_f32"]), original[r["text"]]) for r in memories)
    texts = [json.loads(line) for line in as_text.read_text().splitlines()]
    assert texts[0]["vectors"] is False
    assert [r for r in texts if r.get("kind") == "memory" and "vector_f32" in r] == []
    # The vectors of the file reversed (still unit length): kept as they are, the import embeds nothing.
    for r in memories:
        r["vector_f32"] = pack_vector(unpack_vector(r["vector_f32"])[::-1])
    with_vectors.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps({**r, "embedder": {"name": "other", "dim": 512, "id": "other:512"}}
                                          if n == 0 else r) for n, r in enumerate(lines)) + "\n")

    async with Stack(tmp_path / "b") as stack:
        for path, namespace in ((with_vectors, "kept"), (as_text, "text"), (other, "other")):
            done = await agentmesh(stack, "import", str(path), "--namespace", namespace)
            assert done.returncode == 0, done.stderr
            if namespace == "other":
                assert "the file's vectors are of other:512, this home embeds with hashing-v1:512" in done.stderr
        kept, text, again = [await _vectors(stack, ns) for ns in ("kept", "text", "other")]
        assert all(_close(kept[t], original[t][::-1]) for t in original)
        assert all(_close(text[t], original[t]) and _close(again[t], original[t]) for t in original)
