"""A turn's start asks memory only for what was appended after the transcript the agent kept
(StartTurn's known_through_seq and known_generation), and a kept copy that any other change made
stale is never used: a run dropped, the transcript cleared, the session deleted and created
again — each gives the transcript a new generation — while appends by another agent replica come
with the tail, and the copy outlives a memory restart.

Over real gRPC, with the agent's own adapter (GrpcTurnStart) against the memory service: what
each turn starts with must be the stored transcript, message for message.
"""

from __future__ import annotations

from agentmesh.agent.adapters.kept_transcripts import KeptTranscripts
from agentmesh.agent.adapters.memory import GrpcTurnStart
from agentmesh.agent.types import ChatMessage
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.v1 import common_pb2, sessions_pb2
from tests.memory.test_start_turn import as_gateway


def said(role: str, text: str, run_id: str = "") -> common_pb2.Message:
    return common_pb2.Message(role=role, content=text, run_id=run_id)


class Agent:
    """One agent replica: its adapter of StartTurn and the transcripts it keeps."""

    def __init__(self, memory_service, kept: KeptTranscripts | None = None):
        self.kept = kept if kept is not None else KeptTranscripts()
        self.turns = GrpcTurnStart(memory_service.client, memory_service.host.target, kept=self.kept)

    async def start(self, session_id: str, text: str, run_id: str = "") -> list[tuple[int, str]]:
        begun = await self.turns.start(session_id, [ChatMessage(role="user", content=text, run_id=run_id)],
                                       namespace="default", query=text, k=0, recall_timeout_s=1)
        return [(m.seq, m.content) for m in begun.stored]


async def stored_before_last(memory_service, session_id: str) -> list[tuple[int, str]]:
    """The stored transcript without its last message (the one the turn's start appended)."""
    messages = await memory_service.client.transcript(session_id)
    return [(m.seq, m.content) for m in messages[:-1]]


def start(session_id: str, text: str, **kw) -> memory_service_pb2.StartTurnRequest:
    return memory_service_pb2.StartTurnRequest(session_id=session_id, messages=[said("user", text)], **kw)


async def test_memory_answers_what_follows_the_seq_named_while_its_generation_holds(memory_service):
    client, stub = memory_service.client, memory_service.stub
    await client.put_session("s1")
    await client.append_messages("s1", [said("user", "one"), said("assistant", "two")])
    first = await stub.StartTurn(start("s1", "three"))
    assert [m.seq for m in first.messages] == [1, 2] and first.messages_after_seq == 0 and first.generation
    await client.append_messages("s1", [said("assistant", "four")])

    tail = await stub.StartTurn(start("s1", "five", known_through_seq=2, known_generation=first.generation))
    assert [(m.seq, m.content) for m in tail.messages] == [(3, "three"), (4, "four")]
    assert (tail.messages_after_seq, tail.generation, tail.first_seq) == (2, first.generation, 5)

    # A generation not the stored one, none, or a seq past the transcript: the whole transcript.
    for known in ({"known_generation": "0123456789abcdef"}, {"known_generation": ""}, {"known_through_seq": 99}):
        whole = await stub.StartTurn(start("s1", "again", **{"known_through_seq": 2,
                                                             "known_generation": first.generation, **known}))
        assert whole.messages_after_seq == 0 and [m.seq for m in whole.messages][:3] == [1, 2, 3]


async def test_appends_by_another_replica_come_with_the_tail_and_each_replica_keeps_its_own(memory_service):
    client = memory_service.client
    await client.put_session("s2")
    one, two = Agent(memory_service), Agent(memory_service)
    for n in range(3):
        for agent in (one, two):
            stored = await agent.start("s2", f"{n}-{id(agent)}")
            assert stored == await stored_before_last(memory_service, "s2")
            await client.append_messages("s2", [said("assistant", f"answer {n}")])  # the turn's own step
    assert one.kept.get("s2") is not None and two.kept.get("s2") is not None
    assert one.kept.get("s2").through_seq < two.kept.get("s2").through_seq


async def test_a_dropped_run_written_over_is_never_read_from_the_kept_copy(memory_service):
    client = memory_service.client
    await client.put_session("s3")
    await client.append_messages("s3", [said("user", "m1"), said("assistant", "m2")])
    agent = Agent(memory_service)
    await agent.start("s3", "q1", run_id="r1")
    await client.append_messages("s3", [said("assistant", "a1", run_id="r1")])
    assert await agent.start("s3", "q2", run_id="r2") == [(1, "m1"), (2, "m2"), (3, "q1"), (4, "a1")]
    assert agent.kept.get("s3").through_seq == 4
    # Both runs rolled back, and other messages written at the same seqs, and one more: the kept
    # copy's seqs 3 and 4 no longer say what is stored there.
    async with as_gateway(memory_service) as channel:
        gateway = memory_service_pb2_grpc.MemoryStub(channel)
        for run_id in ("r2", "r1"):
            assert (await gateway.DropRun(memory_service_pb2.DropRunRequest(session_id="s3", run_id=run_id))).dropped
    await client.append_messages("s3", [said("user", "x3"), said("assistant", "x4"), said("user", "x5")])

    stored = await agent.start("s3", "q3")

    assert stored == [(1, "m1"), (2, "m2"), (3, "x3"), (4, "x4"), (5, "x5")]
    assert stored == await stored_before_last(memory_service, "s3")


async def test_a_cleared_transcript_or_a_session_made_again_is_read_whole(memory_service):
    client = memory_service.client
    agent = Agent(memory_service)
    await client.put_session("s4")
    await client.append_messages("s4", [said("user", "old 1"), said("assistant", "old 2")])
    await agent.start("s4", "old 3")
    assert agent.kept.get("s4").through_seq == 2

    async with as_gateway(memory_service) as channel:
        await memory_service_pb2_grpc.MemoryStub(channel).ClearTranscript(sessions_pb2.ClearTranscriptRequest(session_id="s4"))
    await client.append_messages("s4", [said("user", "new 1"), said("assistant", "new 2"), said("user", "new 3")])
    assert await agent.start("s4", "new 4") == [(1, "new 1"), (2, "new 2"), (3, "new 3")]

    await client.delete_session("s4")
    await client.put_session("s4")
    await client.append_messages("s4", [said("user", f"again {n}") for n in range(1, 7)])
    assert await agent.start("s4", "again 7") == [(n, f"again {n}") for n in range(1, 7)]


async def test_the_kept_copy_outlives_a_memory_restart(memory_service):
    client = memory_service.client
    await client.put_session("s5")
    await client.append_messages("s5", [said("user", "before"), said("assistant", "the restart")])
    kept = KeptTranscripts()
    await Agent(memory_service, kept).start("s5", "q1")
    generation = kept.get("s5").generation

    await memory_service.restart()
    await memory_service.client.append_messages("s5", [said("assistant", "a1")])
    # The stored generation survived: memory answers the tail of what the agent kept.
    tail = await memory_service.stub.StartTurn(start("s5", "probe", known_through_seq=2, known_generation=generation))
    assert tail.messages_after_seq == 2 and [m.content for m in tail.messages] == ["q1", "a1"]
    stored = await Agent(memory_service, kept).start("s5", "q2")  # the agent's client, reconnected
    assert stored == await stored_before_last(memory_service, "s5")
    assert [text for _, text in stored] == ["before", "the restart", "q1", "a1", "probe"]


def test_kept_transcripts_are_bounded_by_sessions_and_by_size():
    kept = KeptTranscripts(max_sessions=2, max_bytes=10_000)
    message = ChatMessage(role="user", content="x" * 1000, seq=1)
    for session_id in ("a", "b", "c"):
        kept.put(session_id, "g", None, [message])
    assert (kept.get("a"), len(kept)) == (None, 2)  # the least recently used went
    kept.get("b")
    kept.put("d", "g", None, [message])
    assert kept.get("c") is None and kept.get("b") is not None
    big = [ChatMessage(role="user", content="y" * 4000, seq=n) for n in range(1, 4)]
    kept.put("e", "g", None, big)  # alone over the bound: not kept, and nothing else pushed out
    assert kept.get("e") is None and len(kept) == 2 and kept.size <= 10_000
    grown = kept.put("b", "h", kept.get("b"), [ChatMessage(role="assistant", content="z", seq=2)])
    assert [m.seq for m in grown.messages] == [1, 2] and kept.get("b") == grown
