"""The narrow interfaces the gateway core depends on. `peers.py` implements them over gRPC
(the memory, agent and tools services); tests implement them in a few lines each.

The gateway relays the agent's events to the client unchanged, so these speak the
`agentmesh.v1` messages the core passes along as data (docs/architecture.md, "Known exceptions").
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Protocol

from agentmesh.v1 import agent_pb2, common_pb2, gateway_pb2

__all__ = ["AgentRunner", "SessionStore", "Workspaces"]


class SessionStore(Protocol):
    async def put_session(self, session: gateway_pb2.Session) -> tuple[gateway_pb2.Session, bool]: ...
    async def get_session(self, session_id: str) -> gateway_pb2.Session: ...
    async def list_sessions(self, page_size: int, page_token: str) -> gateway_pb2.ListSessionsResponse: ...
    async def delete_session(self, session_id: str) -> bool: ...
    async def list_messages(self, session_id: str, page_size: int, after_seq: int) -> gateway_pb2.GetTranscriptResponse: ...


class AgentRunner(Protocol):
    def run_turn(
        self, request: agent_pb2.RunTurnRequest, decisions: "asyncio.Queue[common_pb2.ApprovalDecision]"
    ) -> AsyncIterator[common_pb2.Event]:
        """Stream the turn's events; decisions put on the queue travel to the agent running it."""
        ...


class Workspaces(Protocol):
    async def delete_workspace(self, session_id: str) -> None: ...
