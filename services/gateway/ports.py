"""The narrow interfaces the gateway core depends on. `peers.py` implements them over gRPC
(the memory, agent and tools services); tests implement them in a few lines each.

The gateway relays the agent's events to the client unchanged, so these speak the
`agentmesh.v1` messages the core passes along as data (docs/architecture.md, "Known exceptions").
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Protocol

from agentmesh.internal.v1 import agent_service_pb2
from agentmesh.v1 import common_pb2, sessions_pb2

__all__ = ["AgentRunner", "SessionStore", "Workspaces"]


class SessionStore(Protocol):
    async def put_session(self, session: sessions_pb2.Session) -> tuple[sessions_pb2.Session, bool]: ...
    async def get_session(self, session_id: str) -> sessions_pb2.Session: ...
    async def list_sessions(self, page_size: int, page_token: str) -> sessions_pb2.ListSessionsResponse: ...
    async def delete_session(self, session_id: str) -> bool: ...
    async def list_messages(self, session_id: str, page_size: int, after_seq: int) -> sessions_pb2.GetTranscriptResponse: ...
    async def list_model_calls(self, session_id: str, run_id: str) -> sessions_pb2.ListModelCallsResponse: ...
    async def drop_run(self, session_id: str, run_id: str) -> int: ...
    async def update_session(self, request: sessions_pb2.UpdateSessionRequest) -> sessions_pb2.Session: ...
    async def clear_transcript(self, session_id: str) -> int: ...


class AgentRunner(Protocol):
    def run_turn(
        self, request: agent_service_pb2.RunTurnRequest, controls: "asyncio.Queue[agent_service_pb2.RunTurnRequest | None]"
    ) -> AsyncIterator[common_pb2.Event]:
        """Stream the turn's events; what is put on the queue (approval decisions, an interrupt)
        travels to the agent running it. The runner puts None on it when the turn's call is over."""
        ...


class Workspaces(Protocol):
    async def delete_workspace(self, session_id: str) -> None: ...
