"""A home written by the old embedded store (qdrant-client local mode under `qdrant/`) keeps its data.

The old home is made by the same adapter and cores the old service ran (QdrantStore in local
mode, per-namespace collections); then the Edge-backed service, or `agentmesh memory migrate`,
takes it over.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from agentmesh.memory.embedders import build_embedder
from agentmesh.memory.memories import Memories
from agentmesh.memory.memory_records import RememberItem
from agentmesh.memory.qdrant_store import QdrantStore
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.transcript_records import SessionRecord, TranscriptMessage
from agentmesh.memory.transcripts import Transcripts
from agentmesh.v1 import common_pb2

pytestmark = pytest.mark.slow


async def write_old_home(home):
    settings = MemorySettings()
    store = QdrantStore.connect(path=home / "qdrant", layout="per-namespace")
    await store.open()
    embedder = build_embedder(settings)
    try:
        transcripts = Transcripts(store, settings)
        memories = Memories(store, embedder, settings)
        await memories.open()
        for sid in ("s1", "s2"):
            await transcripts.put_session(SessionRecord(sid, namespace="alice"))
            await transcripts.append_messages(sid, [TranscriptMessage(role="user", content=f"{sid} says {i}") for i in range(3)])
        for text in ("Alice prefers green tea", "Alice's dog is called Biscuit", "The deploy key rotates monthly"):
            await memories.remember(RememberItem(namespace="alice", text=text, kind="preference"))
        await memories.remember(RememberItem(namespace="bob", text="Bob drives a red car"))
    finally:
        await embedder.close()
        await store.close()


async def check_migrated(client):
    assert [m.content for m in await client.transcript("s1")] == ["s1 says 0", "s1 says 1", "s1 says 2"]
    assert (await client.get_session("s2")).message_count == 3
    hits = await client.search("which tea does alice like", namespace="alice", k=1)
    assert hits[0].memory.text == "Alice prefers green tea"
    assert [h.memory.text for h in await client.search("car", namespace="bob", k=3)] == ["Bob drives a red car"]
    listed, _ = await client.list_memories(namespace="alice", page_size=10)
    assert len(listed) == 3


async def test_the_service_migrates_an_old_home_on_first_start_and_leaves_the_old_files(make_memory_service, tmp_path):
    home = tmp_path / "home"
    await write_old_home(home)
    old_files = sorted(p.relative_to(home) for p in (home / "qdrant").rglob("*"))

    service = await make_memory_service(home=home)
    await check_migrated(service.client)
    assert sorted(p.relative_to(home) for p in (home / "qdrant").rglob("*")) == old_files
    assert (home / "memory" / "MIGRATED").exists()
    # Once migrated, a restart neither migrates again nor loses anything written since.
    await service.client.append_messages("s1", [common_pb2.Message(role="user", content="new")])
    await service.restart()
    assert [m.content for m in await service.client.transcript("s1")][-2:] == ["s1 says 2", "new"]


async def test_agentmesh_memory_migrate_shows_progress_and_a_count(make_memory_service, tmp_path):
    home = tmp_path / "home"
    await write_old_home(home)
    env = {**os.environ, "AGENTMESH_HOME": str(home), "AGENTMESH_TRACES": "none"}
    run = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentmesh.cli.main", "memory", "migrate"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "migrated 2 sessions, 6 messages and 4 memories" in run.stdout
    assert "agentmesh_messages" in run.stderr and "6/6" in run.stderr  # the progress bar
    again = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentmesh.cli.main", "memory", "migrate"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already migrated" in again.stdout

    service = await make_memory_service(home=home)
    await check_migrated(service.client)
    # With the service running, the home is in use: the command says so and changes nothing.
    busy = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentmesh.cli.main", "memory", "migrate"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert busy.returncode != 0 and "in use by another process" in busy.stderr
