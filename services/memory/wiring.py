"""The memory service's composition root: `build()` opens the store and the embedder, wires the
cores onto them and the servicer onto a host (agentmesh.rpc.launch starts it from here)."""

from __future__ import annotations

from typing import cast

from agentmesh.config import Settings
from agentmesh.internal.v1 import memory_service_pb2_grpc
from agentmesh.logs import get_logger
from agentmesh.memory.a2a_tasks import A2aTasks
from agentmesh.memory.agents import Agents
from agentmesh.memory.blocks import Blocks
from agentmesh.memory.embedders import build_embedder
from agentmesh.memory.heap import HeapReleaser
from agentmesh.memory.mcp_registry import McpRegistry
from agentmesh.memory.memories import Memories
from agentmesh.memory.namespaces import Namespaces
from agentmesh.memory.ports import AgentStore
from agentmesh.memory.profiles import Profiles
from agentmesh.memory.promoted import PromotedTools
from agentmesh.memory.recall import ConversationIndex
from agentmesh.memory.reflections import Reflections
from agentmesh.memory.retention import Retention
from agentmesh.memory.runs import DocumentRuns, Runs, WebhookSecrets
from agentmesh.memory.server import MemoryServicer
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.skills import SkillLimits, Skills
from agentmesh.memory.stores import open_documents, open_store
from agentmesh.memory.teams import TeamRecords
from agentmesh.memory.transcripts import Transcripts
from agentmesh.memory.usage import UsageLedger
from agentmesh.rpc.server import MAX_MESSAGE_BYTES, ServiceHost
from agentmesh.telemetry import Telemetry

__all__ = ["build"]

log = get_logger("agentmesh.memory")


async def build(settings: Settings, telemetry: Telemetry, address: str | None = None) -> ServiceHost:
    memory_settings = settings.section(MemorySettings)
    store = await open_store(settings.home, settings.qdrant_url, memory_settings)
    embedder = build_embedder(memory_settings)
    try:
        memories = Memories(store, embedder, memory_settings, tracer=telemetry.tracer)
        await memories.open()
        # Standing instructions, skills, promoted tools and reflection runs, beside the memories.
        documents = await open_documents(store)
    except BaseException:
        await store.close()
        await embedder.close()
        raise
    # Appends and imports carry batches (a turn's messages, 256 memories from the CLI).
    host = ServiceHost("memory", settings, telemetry, address=address, max_receive_bytes=MAX_MESSAGE_BYTES)
    namespaces = Namespaces(store)
    transcripts = Transcripts(store, memory_settings)
    conversations = ConversationIndex(store, documents, transcripts, memories, memory_settings)
    retention = Retention(store, documents, namespaces, transcripts, memory_settings.retention_max_items)
    servicer = MemoryServicer(transcripts, memories, namespaces,
                              Profiles(documents, max_chars=memory_settings.profile_max_chars),
                              Skills(documents, SkillLimits()),
                              PromotedTools(documents, max_tools=memory_settings.promoted_tools_max),
                              Reflections(documents), UsageLedger(store), host.audit,
                              mcp_registry=McpRegistry(documents, namespaces), a2a_tasks=A2aTasks(documents),
                              # Both document adapters are agent stores too (agent_records.py).
                              agents=Agents(cast(AgentStore, documents)),
                              blocks=Blocks(documents, max_chars=memory_settings.block_max_chars,
                                            max_blocks=memory_settings.blocks_max),
                              conversations=conversations if memory_settings.conversation_index else None,
                              runs=Runs(DocumentRuns(documents)), webhook_secrets=WebhookSecrets(documents),
                              retention=retention, teams=TeamRecords(documents))
    host.add(memory_service_pb2_grpc.add_MemoryServicer_to_server, servicer, "agentmesh.internal.v1.Memory")
    # Open carried calls' streams would hold the drain up: they end once their calls are answered.
    for carried in servicer.carry(host.calls):
        host.on_drain(carried.close)

    async def close() -> None:
        await embedder.close()
        # Releases the embedded store's file lock so the next start on this home can open it.
        await store.close()

    host.on_stop(close)
    if memory_settings.conversation_index:
        # Indexes what a crash after an append's ack left behind, then each append as it comes.
        conversations.start()
        host.on_stop(conversations.stop)
    # Freed request buffers go back to the OS instead of staying in gRPC threads' arenas (heap.py).
    releaser = HeapReleaser()
    releaser.start()
    host.on_stop(releaser.stop)
    log.info("memory store ready", store=store.where, embedder=embedder.name, dim=embedder.dim)
    return host
