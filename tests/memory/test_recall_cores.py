"""The recall cores against every store adapter: conversations indexed from transcripts and
searched with their filters (recall.py), and memory blocks versioned, reverted and held as drafts
(blocks.py) — each kept across a reopen of the store. The cores use the existing ports only
(long-term store, transcript store, document store), so these run them on the same adapters as
the ports' conformance suites: Qdrant Edge embedded (a shard per namespace, and shared), and the
Qdrant-server adapter through qdrant-client's local mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentmesh.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from agentmesh.memory.blocks import Blocks, Edit, Provenance
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.embedders import HashingEmbedder
from agentmesh.memory.memories import Memories
from agentmesh.memory.qdrant_store import QdrantStore
from agentmesh.memory.recall import ConversationIndex, ConversationQuery
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.stores import open_documents
from agentmesh.memory.transcript_records import SessionRecord, ToolCallRecord, TranscriptMessage
from agentmesh.memory.transcripts import Transcripts


@pytest.fixture(params=["edge", "edge-shared", "server"])
async def cores(request, tmp_path):
    opened = []

    async def open_cores():
        home = tmp_path / "home"
        store = (QdrantStore.connect(path=home / "qdrant", layout="shared") if request.param == "server"
                 else EdgeStore(home, layout="shared" if request.param == "edge-shared" else "per-namespace"))
        await store.open()
        opened.append(store)
        settings = MemorySettings()
        memories = Memories(store, HashingEmbedder(dim=64), settings)
        await memories.open()
        documents = await open_documents(store)
        transcripts = Transcripts(store, settings)
        return (store, transcripts, ConversationIndex(store, documents, transcripts, memories, settings),
                Blocks(documents, max_chars=120, max_blocks=3))

    async def reopen(store):
        await store.close()
        opened.remove(store)
        return await open_cores()

    open_cores.reopen = reopen
    yield open_cores
    for store in opened:
        await store.close()


async def _session(transcripts, session_id, namespace, *messages):
    await transcripts.put_session(SessionRecord(session_id=session_id, namespace=namespace))
    await transcripts.append_messages(session_id, list(messages))


async def test_conversations_are_found_with_their_neighbours_filters_and_namespace(cores):
    store, transcripts, index, _ = await cores()
    await _session(transcripts, "s1", "team-a",
                   TranscriptMessage("user", "My dog is called Biscuit.", created_at=1_700_000_000),
                   TranscriptMessage("assistant", "Looking up Biscuit.",
                                     tool_calls=[ToolCallRecord("c1", "web_search", "{}"),
                                                 ToolCallRecord("c2", "read_file", "{}")],
                                     created_at=1_700_000_001),
                   TranscriptMessage("tool", "Biscuit: a beagle name", tool_call_id="c1", name="web_search",
                                     created_at=1_700_000_002),
                   TranscriptMessage("tool", "README", tool_call_id="c2", name="read_file", created_at=1_700_000_002),
                   TranscriptMessage("assistant", "Biscuit is a lovely beagle name.", created_at=1_700_000_003))
    await _session(transcripts, "s2", "team-a", TranscriptMessage("user", "Biscuit likes the park.",
                                                                  created_at=1_800_000_000))
    await _session(transcripts, "b1", "team-b", TranscriptMessage("user", "My dog is called Biscuit too."))
    for session_id in ("s1", "s2", "b1"):
        index.appended(session_id)

    hits = await index.search("team-a", ConversationQuery("Biscuit"))
    # Tool results are not indexed; the assistant message that called the tools is.
    assert {(h.session_id, h.seq) for h in hits} == {("s1", 1), ("s1", 2), ("s1", 5), ("s2", 1)}
    first = next(h for h in hits if (h.session_id, h.seq) == ("s1", 5))
    assert first.before is not None and first.before.role == "tool" and first.after is None
    assert [h.session_id for h in await index.search("team-b", ConversationQuery("Biscuit"))] == ["b1"]

    by_session = await index.search("team-a", ConversationQuery("Biscuit", session_id="s2"))
    assert [(h.session_id, h.seq) for h in by_session] == [("s2", 1)]
    by_role = await index.search("team-a", ConversationQuery("Biscuit", role="assistant"))
    assert {(h.session_id, h.seq) for h in by_role} == {("s1", 2), ("s1", 5)}
    by_time = await index.search("team-a", ConversationQuery("Biscuit", since=1_750_000_000))
    assert [(h.session_id, h.seq) for h in by_time] == [("s2", 1)]
    by_tool = await index.search("team-a", ConversationQuery("Biscuit", tool="read_file"))
    assert [(h.session_id, h.seq) for h in by_tool] == [("s1", 2)]  # one of the tools it called
    assert await index.search("team-a", ConversationQuery("Biscuit", tool="shell")) == []
    with pytest.raises(InvalidArgument, match="role 'system' is not one the index keeps"):
        await index.search("team-a", ConversationQuery("Biscuit", role="system"))

    # A cleared transcript is not answered; the watermarks survive a reopen (nothing to catch up).
    await transcripts.clear_transcript("s2")
    assert {h.session_id for h in await index.search("team-a", ConversationQuery("Biscuit"))} == {"s1"}
    store, transcripts, index, _ = await cores.reopen(store)
    assert await index.catch_up() == 0
    assert {h.session_id for h in await index.search("team-a", ConversationQuery("park Biscuit"))} == {"s1"}


async def test_a_message_is_found_by_the_words_of_the_messages_around_it(cores):
    # An answer rarely repeats the question's words: each message is indexed with its neighbours'
    # words (weaker), also when the answer is appended after the question was indexed.
    _, transcripts, index, _ = await cores()
    await _session(transcripts, "other", "team-a", *[
        TranscriptMessage("user", text) for text in
        ("The invoice is due on Friday.", "Please rename the build job.", "Lunch is at noon tomorrow.",
         "The printer on floor two is broken.", "Send the slides to Dana.")
    ])
    await _session(transcripts, "s1", "team-a", TranscriptMessage("user", "How was the camping trip with the kids?"))
    index.appended("other")
    index.appended("s1")
    await index.flush()
    await transcripts.append_messages("s1", [
        TranscriptMessage("assistant", "Amazing: we roasted marshmallows by the lake every night."),
    ])
    index.appended("s1")

    async def top(query: str) -> list[str]:
        return [h.text for h in await index.search("team-a", ConversationQuery(query, k=2))]

    assert await top("camping trip") == ["How was the camping trip with the kids?",
                                         "Amazing: we roasted marshmallows by the lake every night."]
    assert await top("marshmallows lake") == ["Amazing: we roasted marshmallows by the lake every night.",
                                              "How was the camping trip with the kids?"]


async def test_appends_not_yet_indexed_are_caught_up_from_the_watermark(cores):
    store, transcripts, index, _ = await cores()
    await _session(transcripts, "s1", "team-a", TranscriptMessage("user", "The code word is marmalade."))
    index.appended("s1")
    await index.flush()
    # Acknowledged, then the process stops before the index hears of it.
    await transcripts.append_messages("s1", [TranscriptMessage("user", "The second code word is treacle.")])
    store, transcripts, index, _ = await cores.reopen(store)
    assert await index.catch_up() == 1
    hits = await index.search("team-a", ConversationQuery("second code word treacle"))
    assert [(h.session_id, h.seq) for h in hits][:1] == [("s1", 2)]
    assert hits[0].before is not None and hits[0].before.content == "The code word is marmalade."


async def test_blocks_are_versioned_reverted_and_held_as_drafts_across_a_reopen(cores):
    store, _, _, blocks = await cores()
    agent = Provenance(session_id="s1", seq=3, model="m", by="agent")
    await blocks.edit("team-a", "user", Edit("append", "Name: Ada."), agent)
    await blocks.edit("team-a", "user", Edit("replace", "Lovelace", "Ada"), agent)
    await blocks.edit("team-a", "persona", Edit("append", "Terse."), agent)
    assert [(b.name, b.text, b.version) for b in await blocks.list("team-a")] == [
        ("persona", "Terse.", 1), ("user", "Name: Lovelace.", 2)]
    with pytest.raises(FailedPrecondition, match="does not contain the text to replace"):
        await blocks.edit("team-a", "user", Edit("replace", "x", "Bob"), agent)
    with pytest.raises(FailedPrecondition, match="would hold 136 characters; the limit is 120"):
        await blocks.edit("team-a", "user", Edit("append", "y" * 120), agent)
    await blocks.edit("team-a", "project", Edit("append", "agentmesh"), agent)
    with pytest.raises(FailedPrecondition, match="has 3 blocks, the most it may have"):
        await blocks.edit("team-a", "notes", Edit("append", "x"), agent)

    reverted = await blocks.revert("team-a", "user", 1, by="alice")
    assert (reverted.text, reverted.version) == ("Name: Ada.", 3)
    with pytest.raises(NotFound, match="has no version 7"):
        await blocks.revert("team-a", "user", 7, by="alice")

    await blocks.set_policy("team-a", "draft")
    held = await blocks.edit("team-a", "user", Edit("append", "Works nights."), agent)
    dropped = await blocks.edit("team-a", "user", Edit("append", "Dislikes tea."), agent)
    assert not held.applied and held.draft is not None and held.block.text == "Name: Ada."

    store, _, _, blocks = await cores.reopen(store)
    assert await blocks.policy("team-a") == "draft"
    assert [d.id for d in await blocks.drafts("team-a")] == [held.draft.id, dropped.draft.id]
    assert (await blocks.reject("team-a", dropped.draft.id)).text == "Name: Ada."
    approved = await blocks.approve("team-a", held.draft.id, by="alice")
    assert (approved.text, approved.version) == ("Name: Ada.\nWorks nights.", 4)
    full = await blocks.get("team-a", "user")
    assert [(v.version, v.change, v.provenance.by) for v in full.versions] == [
        (4, "append", "agent, approved by alice"), (3, "revert", "alice"), (2, "replace", "agent"), (1, "append", "agent")]
    assert full.versions[0].provenance.session_id == "s1" and full.versions[0].provenance.seq == 3
    assert full.drafts == () and await blocks.list("team-b") == []


async def test_a_block_is_written_by_a_person_and_restored_with_its_history_across_a_reopen(cores):
    store, _, _, blocks = await cores()
    agent = Provenance(session_id="s1", seq=3, model="m", by="agent")
    await blocks.edit("team-a", "user", Edit("append", "Ada keeps owls."), agent, user="user:ada")
    await blocks.edit("team-a", "project", Edit("append", "Ships on Fridays."), agent)
    written = await blocks.set("team-a", "project", "  Ships on Mondays. ", by="user:boss")
    assert (written.text, written.version) == ("Ships on Mondays.", 2)
    with pytest.raises(FailedPrecondition, match="would hold 121 characters; the limit is 120"):
        await blocks.set("team-a", "project", "z" * 121, by="user:boss")
    # Every person's block, each with whose it is (an admin's list, an export's).
    assert [(b.name, b.user, b.text) for b in await blocks.list_everyones("team-a")] == [
        ("user", "user:ada", "Ada keeps owls."), ("project", "", "Ships on Mondays.")]

    # Restored into another namespace as exported: the history, its numbers and provenance.
    project = await blocks.get("team-a", "project")
    ada = await blocks.get("team-a", "user", "user:ada")
    for block in (project, ada):
        await blocks.restore(replace(block, namespace="team-b", versions=tuple(reversed(block.versions))))
    with pytest.raises(AlreadyExists, match="already has block 'project'"):
        await blocks.restore(replace(project, namespace="team-b"))
    with pytest.raises(InvalidArgument, match="only user is kept per person"):
        await blocks.restore(replace(project, namespace="team-c", user="user:ada"))
    with pytest.raises(InvalidArgument, match="numbered from 1"):
        await blocks.restore(replace(project, namespace="team-c", versions=()))

    store, _, _, blocks = await cores.reopen(store)
    moved = await blocks.get("team-b", "project")
    assert [(v.version, v.change, v.provenance.by) for v in moved.versions] == [(2, "set", "user:boss"), (1, "append", "agent")]
    assert (moved.text, moved.version, moved.versions[1].provenance.session_id) == ("Ships on Mondays.", 2, "s1")
    assert (await blocks.get("team-b", "user", "user:ada")).text == "Ada keeps owls."
    assert [b.name for b in await blocks.list("team-b")] == ["project"]  # Ada's is hers, not the namespace's
    reverted = await blocks.revert("team-b", "project", 1, by="user:boss")
    assert (reverted.text, reverted.version) == ("Ships on Fridays.", 3)
    # With replace: the old history goes, the file's stands.
    await blocks.set_policy("team-b", "draft")
    await blocks.edit("team-b", "project", Edit("append", "Proposed."), agent)
    await blocks.restore(replace(project, namespace="team-b"), replace=True)
    again = await blocks.get("team-b", "project")
    assert ([v.version for v in again.versions], again.text, again.drafts) == ([2, 1], "Ships on Mondays.", ())
