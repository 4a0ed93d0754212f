"""The conversation index's pass (recall.py) on the embedded store: what it writes when a
conversation arrives turn by turn is what it writes for the same conversation indexed at once
(the window before the new messages is indexed again with vectors kept from the previous pass),
and a pass over several sessions lets the service's other calls in between sessions."""

from __future__ import annotations

import asyncio

from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.embedders import HashingEmbedder
from agentmesh.memory.memories import Memories
from agentmesh.memory.ports import SPARSE, VECTOR_KEY, PointFilter
from agentmesh.memory.recall import WATERMARK, ConversationIndex, index_namespace
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.stores import open_documents
from agentmesh.memory.text import SparseEncoder, Tokenizer
from agentmesh.memory.transcript_records import SessionRecord, TranscriptMessage
from agentmesh.memory.transcripts import Transcripts

TURNS = [
    ("How was the camping trip with the kids?", "Amazing: we roasted marshmallows by the lake."),
    ("Did it rain on Saturday?", "Only at night, the tent held."),
    ("What will you cook next time?", "Pancakes on the camping stove, the kids asked for them."),
]


async def _open(tmp_path):
    store = EdgeStore(tmp_path / "home")
    await store.open()
    settings = MemorySettings()
    memories = Memories(store, HashingEmbedder(dim=64), settings)
    await memories.open()
    documents = await open_documents(store)
    transcripts = Transcripts(store, settings)
    return store, documents, transcripts, ConversationIndex(store, documents, transcripts, memories, settings)


def _turn(n: int) -> list[TranscriptMessage]:
    question, answer = TURNS[n]
    at = 1_700_000_000 + 60 * n
    return [TranscriptMessage("user", question, created_at=at),
            TranscriptMessage("assistant", answer, created_at=at + 1)]


async def _points(store, namespace: str) -> dict[int, tuple[str, list[float]]]:
    rows, _ = await store.scroll_memories(PointFilter(namespace=index_namespace(namespace)), 100, None,
                                          with_vectors=True)
    return {int(p["metadata"]["seq"]): (p["text"], p[VECTOR_KEY]) for _, p in rows}


async def _sparse_scores(store, namespace: str, query: str) -> dict[int, float]:
    terms = SparseEncoder(Tokenizer()).query(query)
    rows = await store.ranked(PointFilter(namespace=index_namespace(namespace)), terms, SPARSE, 100)
    return {int(p["metadata"]["seq"]): round(score, 5) for _, score, p in rows}


async def test_a_conversation_indexed_turn_by_turn_is_indexed_as_at_once(tmp_path):
    store, _, transcripts, index = await _open(tmp_path)
    try:
        await transcripts.put_session(SessionRecord(session_id="by-turn", namespace="by-turn"))
        await transcripts.put_session(SessionRecord(session_id="at-once", namespace="at-once"))
        for n in range(len(TURNS)):
            await transcripts.append_messages("by-turn", _turn(n))
            index.appended("by-turn")
            await index.flush()
        await transcripts.append_messages("at-once", [m for n in range(len(TURNS)) for m in _turn(n)])
        index.appended("at-once")
        await index.flush()

        assert await _points(store, "by-turn") == await _points(store, "at-once")
        for query in ("camping kids", "marshmallows lake", "rain tent", "pancakes stove"):
            assert await _sparse_scores(store, "by-turn", query) == await _sparse_scores(store, "at-once", query)
    finally:
        await store.close()


async def test_a_pass_over_several_sessions_lets_other_calls_in_between_them(tmp_path):
    store, documents, transcripts, index = await _open(tmp_path)
    try:
        for session_id in ("s1", "s2"):
            await transcripts.put_session(SessionRecord(session_id=session_id, namespace="team-a"))
            await transcripts.append_messages(session_id, _turn(0))
            index.appended(session_id)

        async def indexed() -> list[str]:
            return [s for s in ("s1", "s2") if await documents.get_document(WATERMARK, "team-a", s) is not None]

        passing = asyncio.create_task(index.flush())
        await asyncio.sleep(0)  # the pass starts, and hands the loop back after its first session
        assert await indexed() == ["s1"]
        await passing
        assert await indexed() == ["s1", "s2"]
    finally:
        await store.close()
