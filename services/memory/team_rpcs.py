# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The memory service's team RPCs (teams.py) as a part of MemoryServicer (server.py) of their
own: proto <-> the core, each checked against the caller's tenants as the rest of the service's
RPCs are."""

from __future__ import annotations

import json
from typing import Any

from agentmesh.errors import FailedPrecondition
from agentmesh.internal.v1 import memory_service_pb2 as pb
from agentmesh.memory.ports import VERSION
from agentmesh.memory.teams import TeamRecords
from agentmesh.memory.tenancy import TenantGuard
from agentmesh.rpc.errors import translate_errors

__all__ = ["TeamRpcs"]


def _record(namespace: str, team: str, kind: str, key: str, body: dict[str, Any]) -> pb.TeamRecord:
    body = dict(body)
    version = int(body.pop(VERSION, 0))
    body.pop("_w", None)
    return pb.TeamRecord(namespace=namespace, team=team, kind=kind, key=key, version=version,
                         body_json=json.dumps(body))


class TeamRpcs:
    """Mixed into MemoryServicer, which sets these."""

    _tenants: TenantGuard
    _team_records: TeamRecords | None

    def _teams(self) -> TeamRecords:
        if self._team_records is None:
            raise FailedPrecondition("this memory service keeps no teams")
        return self._team_records

    @translate_errors
    async def SwapTeamRecord(self, request, context):
        namespace = request.namespace or "default"
        self._tenants.namespace(namespace, "SwapTeamRecord")
        swapped, current = await self._teams().swap(namespace, request.team, request.kind, request.key,
                                                    request.body_json, request.version)
        reply = pb.SwapTeamRecordResponse(swapped=swapped)
        if current is not None:
            reply.current.CopyFrom(_record(namespace, request.team, request.kind, request.key, current))
        return reply

    @translate_errors
    async def ListTeamRecords(self, request, context):
        namespace = request.namespace or "default"
        self._tenants.namespace(namespace, "ListTeamRecords")
        found = await self._teams().list(namespace, request.team, request.kind)
        return pb.ListTeamRecordsResponse(records=[_record(namespace, request.team, request.kind, key, body)
                                                   for key, body in found])

    @translate_errors
    async def WaitTeam(self, request, context):
        namespace = request.namespace or "default"
        self._tenants.namespace(namespace, "WaitTeam")
        change = await self._teams().wait(namespace, request.team, request.after, request.timeout_s)
        return pb.WaitTeamResponse(change=change)
