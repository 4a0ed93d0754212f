"""Teams over the wire (capabilities/teams.py): the team's records in memory (SwapTeamRecord,
ListTeamRecords, WaitTeam) and teammates started as runs through the gateway (CreateRun), which
hands each to whichever agent replica it picks and keeps it going with no client attached. Both
are signed for the user whose lead turn asks (the channels' identity), and carry the lead turn's
trace context, so a teammate's turn is a span of the lead's trace."""

from __future__ import annotations

import json
from typing import Any

from agentmesh.agent.capabilities.team_store import TeammateStart, TeamRecord
from agentmesh.clients.gateway import GatewayClient
from agentmesh.clients.memory import MemoryClient
from agentmesh.internal.v1 import memory_service_pb2 as pb
from agentmesh.rpc.peers import peer_call
from agentmesh.v1 import common_pb2, gateway_pb2

__all__ = ["GatewayTeammateRuns", "GrpcTeamStore"]


def _record(record: pb.TeamRecord) -> TeamRecord:
    return TeamRecord(key=record.key, version=record.version, body=json.loads(record.body_json or "{}"))


class GrpcTeamStore:
    def __init__(self, client: MemoryClient):
        self._client = client
        self._peer = f"the memory service at {client.target}"

    async def swap(self, namespace: str, team: str, kind: str, key: str, body: dict[str, Any],
                   expect: int) -> tuple[bool, TeamRecord | None]:
        request = pb.TeamRecord(namespace=namespace, team=team, kind=kind, key=key, version=expect,
                                body_json=json.dumps(body))
        reply = await peer_call(self._peer, self._client.swap_team_record(request))
        return reply.swapped, (_record(reply.current) if reply.HasField("current") else None)

    async def records(self, namespace: str, team: str, kind: str) -> list[TeamRecord]:
        return [_record(r) for r in await peer_call(self._peer, self._client.list_team_records(namespace, team, kind))]

    async def wait(self, namespace: str, team: str, after: int, timeout_s: float) -> int:
        return await peer_call(self._peer, self._client.wait_team(namespace, team, after, timeout_s))


class GatewayTeammateRuns:
    def __init__(self, client: GatewayClient, timeout_s: float = 30.0):
        self._client = client
        self._peer = f"the gateway at {client.target}"
        self._timeout_s = timeout_s

    async def start(self, start: TeammateStart) -> str:
        options = gateway_pb2.ChatOptions(
            model=start.model, permission_mode=start.permission_mode, max_iterations=start.max_iterations,
            token_budget=start.token_budget, tools=common_pb2.ToolPolicy(allow=list(start.allow), deny=list(start.deny)))
        request = gateway_pb2.CreateRunRequest(session_id=start.session_id, message=start.message, options=options)
        run = await peer_call(self._peer, self._client.stub.CreateRun(request, timeout=self._timeout_s))
        return str(run.run_id)

    async def state(self, run_id: str) -> tuple[str, str]:
        run = await peer_call(self._peer, self._client.stub.GetRun(gateway_pb2.GetRunRequest(run_id=run_id),
                                                                    timeout=self._timeout_s))
        return str(run.state), str(run.error_message)
