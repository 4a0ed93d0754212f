# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The gateway's team RPCs (docs/teams.md): a lead session's team as memory keeps it — its
teammates and the shared board (GetTeam) — a person's message into a mailbox (SendTeamMessage),
and stopping teammates (StopTeammates: their running turns cancelled, on whichever replica owns
each teammate's session). The caller's role is checked on the lead's session first.

A mixin of `GatewayServicer` (server.py), which sets `_authz`, `_learning`, `_core` and
`_forwarded`. The mailbox's shape is the agent's (agent/capabilities/team_store.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

from agentmesh.errors import InvalidArgument, Unavailable
from agentmesh.gateway.authz import Authorizer
from agentmesh.gateway.learning import MemoryLearning
from agentmesh.gateway.namespace_rpcs import current_caller
from agentmesh.internal.v1 import memory_service_pb2 as mpb
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import common_pb2, gateway_pb2

__all__ = ["TeamRpcs"]

MAX_TEXT_CHARS = 20_000
MAX_KEPT_MAIL = 200
MATE_MARK = ".mate-"
_SWAPS = 50


class TeamRpcs:
    _authz: Authorizer | None
    _learning: MemoryLearning | None

    async def _team(self, session_id: str, rpc: str) -> tuple[MemoryLearning, str]:
        if self._learning is None or self._authz is None:
            raise Unavailable("the memory service's team records are not wired in this gateway")
        session = await self._authz.session(current_caller(), session_id, rpc)
        return self._learning, session.namespace or "default"

    async def _records(self, memory: MemoryLearning, namespace: str, team: str,
                       kind: str) -> dict[str, tuple[int, dict[str, Any]]]:
        reply = await memory.forward("ListTeamRecords", mpb.ListTeamRecordsRequest(namespace=namespace, team=team,
                                                                                    kind=kind))
        return {r.key: (r.version, json.loads(r.body_json or "{}")) for r in reply.records}

    @translate_errors
    async def GetTeam(self, request, context):
        memory, namespace = await self._team(request.session_id, "GetTeam")
        team = gateway_pb2.Team(session_id=request.session_id)
        for _, mate in (await self._records(memory, namespace, request.session_id, "mate")).values():
            tokens_in, tokens_out = int(mate.get("input_tokens", 0)), int(mate.get("output_tokens", 0))
            team.teammates.append(common_pb2.TeammateStatus(
                name=str(mate.get("name", "")), state=str(mate.get("state", "")), role=str(mate.get("role", "")),
                session_id=str(mate.get("session_id", "")), run_id=str(mate.get("run_id", "")),
                current_task=str(mate.get("current_task", "")), last_message=str(mate.get("last_message", "")),
                usage=common_pb2.Usage(input_tokens=tokens_in, output_tokens=tokens_out,
                                       total_tokens=tokens_in + tokens_out)))
        board = (await self._records(memory, namespace, request.session_id, "board")).get("board")
        if board is not None:
            for task in json.loads(board[1].get("board", "{}")).get("tasks", []):
                team.tasks.append(common_pb2.Task(
                    id=int(task["id"]), subject=str(task.get("subject", "")), status=str(task.get("status", "")),
                    description=str(task.get("description", "")), owner=str(task.get("owner", "")),
                    blocked_by=[int(b) for b in task.get("blocked_by", [])]))
        return team

    @translate_errors
    async def SendTeamMessage(self, request, context):
        text = request.text.strip()
        if not text or len(text) > MAX_TEXT_CHARS:
            raise InvalidArgument(f"text must be 1-{MAX_TEXT_CHARS} characters", field="text")
        memory, namespace = await self._team(request.session_id, "SendTeamMessage")
        mates = await self._records(memory, namespace, request.session_id, "mate")
        if request.to != "lead" and request.to not in mates:
            known = ", ".join(["lead", *sorted(mates)])
            raise InvalidArgument(f"there is no teammate {request.to[:40]!r} in this team (members: {known})",
                                  field="to")
        sender = current_caller().subject
        for _ in range(_SWAPS):
            box = (await self._records(memory, namespace, request.session_id, "mail")).get(request.to)
            empty: dict[str, Any] = {"next": 1, "messages": []}
            version, body = box if box is not None else (0, empty)
            seq = int(body["next"])
            messages = [*body["messages"], {"seq": seq, "from": sender, "text": text, "at": time.time()}]
            record = mpb.TeamRecord(namespace=namespace, team=request.session_id, kind="mail", key=request.to,
                                    version=version, body_json=json.dumps({"next": seq + 1,
                                                                           "messages": messages[-MAX_KEPT_MAIL:]}))
            if (await memory.forward("SwapTeamRecord", record)).swapped:
                return gateway_pb2.SendTeamMessageResponse(seq=seq)
        raise Unavailable("the mailbox kept changing; try again")

    @translate_errors
    async def StopTeammates(self, request, context):
        memory, namespace = await self._team(request.session_id, "StopTeammates")
        mates = await self._records(memory, namespace, request.session_id, "mate")
        if request.name and request.name not in mates:
            raise InvalidArgument(f"there is no teammate {request.name[:40]!r} in this team", field="name")
        stopped = []
        for name in [request.name] if request.name else sorted(mates):
            cancel = gateway_pb2.CancelRequest(session_id=f"{request.session_id}{MATE_MARK}{name}")
            reply = await self._cancel_anywhere(cancel, context)
            if reply.cancelled:
                stopped.append(name)
        return gateway_pb2.StopTeammatesResponse(stopped=stopped)

    async def _cancel_anywhere(self, request, context) -> gateway_pb2.CancelResponse:
        """Cancel where the session's turn runs (server.py's Cancel)."""
        raise NotImplementedError
