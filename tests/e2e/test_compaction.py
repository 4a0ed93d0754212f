"""Compaction across the real services: a tiny context budget, several turns over gRPC, the
summary visible in GetTranscript and still used after every service restarts."""

from __future__ import annotations

import json

import grpc

from agentmesh.agent.capabilities.compaction import INSTRUCTION
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error, transcript
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.stack import Stack

# Compact past 3 000 characters, keep 1 000 verbatim; each turn below is about 950.
ENV = {"AGENTMESH_AGENT_COMPACT_AT_CHARS": "3000", "AGENTMESH_AGENT_COMPACT_KEEP_CHARS": "1000",
       "AGENTMESH_AGENT_RECALL_K": "0"}


def summarising(request) -> bool:
    return request.messages[0]["content"] == INSTRUCTION


def answer(request):
    if summarising(request):
        return reply("SUMMARY: Ada is planning a trip; turns 0-2 settled the dates.")
    return reply(f"noted {len(request.messages)}")


async def test_a_compacted_session_keeps_its_summary_across_restarts(tmp_path):
    with ScriptedLLMServer(default=answer) as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=ENV) as stack:
            gateway = stack.gateway_stub()
            events = []
            for i in range(5):
                events = await chat(gateway, "trip", f"turn {i}: " + "details " * 110)
                assert of_kind(events, "error") == []
            # The fifth turn started with ~3 800 characters of history: compacted before its model call.
            assert [r for r in llm.requests if summarising(r)] == [llm.requests[-2]]
            assert any(s.message.startswith("compacted 6 earlier messages") for s in of_kind(events, "status"))
            fifth = llm.requests[-1].messages
            assert [m["role"] for m in fifth] == ["system", "system", "user", "assistant", "user"]
            assert "turn 0:" not in json.dumps(fifth) and fifth[2]["content"].startswith("turn 3:")

            stored = await transcript(gateway, "trip")
            summaries = [m for m in stored if m.kind == "summary"]
            assert len(summaries) == 1 and len(stored) == 11  # everything kept, plus the summary
            assert (summaries[0].role, summaries[0].covers_through_seq) == ("system", 6)
            assert summaries[0].content.endswith("turns 0-2 settled the dates.")

            await stack.restart()

            before = len(llm.requests)
            events = await chat(stack.gateway_stub(), "trip", "and the hotel?")
            assert of_kind(events, "run_finished")[0].stop_reason == "completed"
            assert len(llm.requests) == before + 1 and not summarising(llm.requests[-1])
            sent = llm.requests[-1].messages
            assert sent[1]["content"] == summaries[0].content
            # Summary, then every stored message after seq 6 (the summary entry aside), then the new one.
            after = [m.content for m in stored if m.seq > 6 and m.kind != "summary"]
            assert [m["content"] for m in sent[2:]] == [*after, "and the hotel?"]

            # The memory service refuses kinds it does not know, and coverage on a non-summary.
            memory = stack.memory_stub()
            for bad in (common_pb2.Message(role="system", content="x", kind="bogus"),
                        common_pb2.Message(role="user", content="x", covers_through_seq=3)):
                err = await rpc_error(memory.AppendMessages(
                    memory_service_pb2.AppendMessagesRequest(session_id="trip", messages=[bad]), timeout=10))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "message 1" in err.details()
            assert len(await transcript(stack.gateway_stub(), "trip")) == 13
