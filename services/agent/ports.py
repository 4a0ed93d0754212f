"""The narrow interfaces the agent loop depends on. `adapters.py` implements them over gRPC;
tests implement them in a few lines each, so the loop is tested without the wire."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from agentmesh.agent.types import BackgroundDone, ChatMessage, ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError

__all__ = ["BackgroundCommands", "LongTermMemory", "MemoryHit", "NotSupported", "ToolRunner", "TranscriptStore"]


class NotSupported(AgentmeshError):
    """The peer does not implement this (yet): callers degrade instead of failing the turn."""

    code = "UNIMPLEMENTED"


class ToolRunner(Protocol):
    async def list_tools(self, namespace: str = "") -> list[ToolSpec]:
        """The tool catalog (with the namespace's own MCP servers' tools); raises an AgentmeshError
        when the tools service is unreachable."""
        ...

    async def execute(self, session_id: str, call: ToolCall, namespace: str = "") -> ToolOutcome:
        """Run one call. Tool failures and outages come back as an error outcome, never raised;
        cancelling the awaiting task cancels the call (and kills its sandboxed process)."""
        ...


class TranscriptStore(Protocol):
    async def load(self, session_id: str) -> list[ChatMessage]:
        """The session's transcript in order (empty for a new session)."""
        ...

    async def append(self, session_id: str, messages: Sequence[ChatMessage]) -> None:
        """Durably append, in order; raises an AgentmeshError when it cannot."""
        ...


@dataclass(frozen=True)
class MemoryHit:
    id: str
    text: str
    kind: str
    score: float
    created_at: float = 0.0


class LongTermMemory(Protocol):
    async def remember(self, namespace: str, text: str, kind: str, source_session_id: str) -> MemoryHit:
        """Upsert a memory; raises NotSupported or another AgentmeshError."""
        ...

    async def search(self, namespace: str, query: str, k: int) -> list[MemoryHit]:
        """Top-k memories for `query`, best first; raises NotSupported or another AgentmeshError."""
        ...


class BackgroundCommands(Protocol):
    """The tools service's background commands (background_run), seen from the agent."""

    async def take_finished(self, session_id: str) -> list[BackgroundDone]:
        """Commands that ended since the last ask, each handed over once; raises an AgentmeshError."""
        ...

    async def stop(self, session_id: str) -> int:
        """Stop every running background command of the session; raises an AgentmeshError."""
        ...
