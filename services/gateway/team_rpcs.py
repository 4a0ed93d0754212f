# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The gateway's team RPCs (docs/teams.md): a lead session's team as memory keeps it — its
teammates, the shared board and the protocol requests (GetTeam) — a person's message into a
mailbox (SendTeamMessage), and stopping teammates (StopTeammates: their running turns cancelled,
on whichever replica owns each teammate's session). The caller's role is checked on the lead's session first.

A mixin of `GatewayServicer` (server.py), which sets `_authz`, `_learning`, `_core` and
`_forwarded`. The mailbox's shape is the agent's (agent/capabilities/team_store.py).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable

from agentmesh.errors import FailedPrecondition, InvalidArgument, Unavailable
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
        requests = (await self._records(memory, namespace, request.session_id, "protocol")).values()
        for _, body in sorted(requests, key=lambda record: float(record[1].get("created_at", 0))):
            kind = str(body.get("type", ""))
            team.requests.append(gateway_pb2.TeamRequest(
                request_id=str(body.get("id", "")), type=kind, state=str(body.get("state", "")),
                teammate=str(body.get("from" if kind == "plan" else "to", "")), plan=str(body.get("plan", "")),
                note=str(body.get("note", "")), answered_by=str(body.get("by", "")) if kind == "plan" else "",
                created_at=float(body.get("created_at", 0))))
        return team

    @translate_errors
    async def SendTeamMessage(self, request, context):
        text = request.text.strip()
        answering = bool(request.request_id or request.shutdown)
        if (not text and not answering) or len(text) > MAX_TEXT_CHARS:
            raise InvalidArgument(f"text must be 1-{MAX_TEXT_CHARS} characters", field="text")
        if request.request_id and request.shutdown:
            raise InvalidArgument("answer a plan (request_id) or ask for a shutdown (shutdown), not both",
                                  field="shutdown")
        memory, namespace = await self._team(request.session_id, "SendTeamMessage")
        mates = await self._records(memory, namespace, request.session_id, "mate")
        if request.to != "lead" and request.to not in mates:
            known = ", ".join(["lead", *sorted(mates)])
            raise InvalidArgument(f"there is no teammate {request.to[:40]!r} in this team (members: {known})",
                                  field="to")
        sender, team = current_caller().subject, request.session_id
        if request.shutdown:
            if request.to == "lead":
                raise InvalidArgument("a shutdown request goes to a teammate, not to the lead", field="to")
            request_id = f"sd-{uuid.uuid4().hex[:8]}"
            body = {"id": request_id, "type": "shutdown", "from": "lead", "by": sender, "to": request.to,
                    "state": "pending", "note": "", "created_at": time.time()}
            await self._swap(memory, namespace, team, "protocol", request_id, lambda _: body)
            seq = await self._post(memory, namespace, team, request.to, sender, (
                f"[shutdown request {request_id}] The lead asks you to stop. Answer with "
                f"shutdown_response(request_id={request_id!r}, approve, note).") + (f" {text}" if text else ""))
            return gateway_pb2.SendTeamMessageResponse(seq=seq, request_id=request_id, state="pending")
        if request.request_id:
            verdict = "approved" if request.approve else "rejected"

            def answer(body: dict[str, Any] | None) -> dict[str, Any]:
                if body is None or body.get("type") != "plan" or body.get("from") != request.to:
                    raise InvalidArgument(f"there is no plan request {request.request_id[:40]!r} of {request.to[:40]}",
                                          field="request_id")
                if body.get("state") != "pending":
                    raise FailedPrecondition(f"plan request {request.request_id} was answered already "
                                             f"({body.get('state')})")
                return {**body, "state": verdict, "note": text, "by": sender, "answered_at": time.time()}

            await self._swap(memory, namespace, team, "protocol", request.request_id, answer)
            note = text or ("Go ahead." if request.approve else "Revise it.")
            seq = await self._post(memory, namespace, team, request.to, sender,
                                   f"[plan {request.request_id} {verdict}] {note}")
            return gateway_pb2.SendTeamMessageResponse(seq=seq, request_id=request.request_id, state=verdict)
        return gateway_pb2.SendTeamMessageResponse(seq=await self._post(memory, namespace, team, request.to,
                                                                        sender, text))

    async def _swap(self, memory: MemoryLearning, namespace: str, team: str, kind: str, key: str,
                    apply: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """The record changed by `apply` (which may raise to refuse), with a compare-and-set retried
        on a fresh read, as the agent changes it (team_store.Team.change)."""
        for _ in range(_SWAPS):
            current = (await self._records(memory, namespace, team, kind)).get(key)
            version, body = current if current is not None else (0, None)
            changed = apply(dict(body) if body is not None else None)
            record = mpb.TeamRecord(namespace=namespace, team=team, kind=kind, key=key, version=version,
                                    body_json=json.dumps(changed))
            if (await memory.forward("SwapTeamRecord", record)).swapped:
                return changed
        raise Unavailable(f"the team's {kind} record kept changing; try again")

    async def _post(self, memory: MemoryLearning, namespace: str, team: str, to: str, sender: str, text: str) -> int:
        """Append to `to`'s mailbox; the message's number there."""
        seq = 0

        def append(box: dict[str, Any] | None) -> dict[str, Any]:
            nonlocal seq
            box = box or {"next": 1, "messages": []}
            seq = int(box["next"])
            messages = [*box["messages"], {"seq": seq, "from": sender, "text": text, "at": time.time()}]
            return {"next": seq + 1, "messages": messages[-MAX_KEPT_MAIL:]}

        await self._swap(memory, namespace, team, "mail", to, append)
        return seq

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
