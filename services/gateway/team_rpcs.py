# ruff: noqa: N802 - gRPC method names, as in services/*/server.py
"""The gateway's team RPCs (docs/teams.md): a lead session's team as memory keeps it — its
teammates, the shared board and the protocol requests (GetTeam) — a person's message into a
mailbox (SendTeamMessage), and stopping teammates (StopTeammates: their running turns cancelled,
on whichever replica owns each teammate's session). The caller's role is checked on the lead's session first.

`TeammateRecovery` starts again a teammate whose run failed where the gateway sees it end, with
no lead turn needed (docs/teams.md, "Resilience").

A mixin of `GatewayServicer` (server.py), which sets `_authz`, `_learning`, `_core` and
`_forwarded`. The mailbox's shape is the agent's (agent/capabilities/team_store.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Awaitable, Callable

from opentelemetry import context as otel_context
from opentelemetry import propagate

from agentmesh.errors import AgentmeshError, FailedPrecondition, InvalidArgument, Unavailable
from agentmesh.gateway.authz import Authorizer, Caller
from agentmesh.gateway.learning import MemoryLearning
from agentmesh.gateway.namespace_rpcs import current_caller
from agentmesh.internal.v1 import memory_service_pb2 as mpb
from agentmesh.logs import get_logger
from agentmesh.rpc.errors import translate_errors
from agentmesh.v1 import common_pb2, gateway_pb2, sessions_pb2

__all__ = ["TeamRpcs", "TeammateRecovery", "post_mail", "swap_record", "team_records"]

log = get_logger("agentmesh.gateway")

MAX_TEXT_CHARS = 20_000
MAX_KEPT_MAIL = 200
MATE_MARK = ".mate-"
_SWAPS = 50


async def team_records(memory: MemoryLearning, namespace: str, team: str,
                       kind: str) -> dict[str, tuple[int, dict[str, Any]]]:
    """The team's records of `kind`: key -> (version, body)."""
    reply = await memory.forward("ListTeamRecords", mpb.ListTeamRecordsRequest(namespace=namespace, team=team,
                                                                                kind=kind))
    return {r.key: (r.version, json.loads(r.body_json or "{}")) for r in reply.records}


async def swap_record(memory: MemoryLearning, namespace: str, team: str, kind: str, key: str,
                      apply: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
    """The record changed by `apply` (which may raise to refuse), with a compare-and-set retried
    on a fresh read, as the agent changes it (team_store.Team.change)."""
    for _ in range(_SWAPS):
        current = (await team_records(memory, namespace, team, kind)).get(key)
        version, body = current if current is not None else (0, None)
        changed = apply(dict(body) if body is not None else None)
        record = mpb.TeamRecord(namespace=namespace, team=team, kind=kind, key=key, version=version,
                                body_json=json.dumps(changed))
        if (await memory.forward("SwapTeamRecord", record)).swapped:
            return changed
    raise Unavailable(f"the team's {kind} record kept changing; try again")


async def post_mail(memory: MemoryLearning, namespace: str, team: str, to: str, sender: str, text: str) -> int:
    """Append to `to`'s mailbox; the message's number there."""
    seq = 0

    def append(box: dict[str, Any] | None) -> dict[str, Any]:
        nonlocal seq
        box = box or {"next": 1, "messages": []}
        seq = int(box["next"])
        messages = [*box["messages"], {"seq": seq, "from": sender, "text": text, "at": time.time()}]
        return {"next": seq + 1, "messages": messages[-MAX_KEPT_MAIL:]}

    await swap_record(memory, namespace, team, "mail", to, append)
    return seq


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
        return await team_records(memory, namespace, team, kind)

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
        return await swap_record(memory, namespace, team, kind, key, apply)

    async def _post(self, memory: MemoryLearning, namespace: str, team: str, to: str, sender: str, text: str) -> int:
        return await post_mail(memory, namespace, team, to, sender, text)

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


RESUME = (
    "Your previous run ended before it was done ({error}); you are started again in your session. Carry on with "
    "your task from where you were: messages that arrived meanwhile follow."
)
_RESTARTED = ("failed", "interrupted")


class _Taken(Exception):
    """Someone else (the lead's turn, another replica) restarts or ended this teammate already."""


class TeammateRecovery:
    """A teammate's run that ends without the teammate finishing, seen where its end is seen —
    the run ledger's `on_end` on the replica that relayed it, or that found it lost
    (runs.py's lease) — rather than at the lead's next turn: a failed or interrupted run is
    started again in the teammate's session with what its record's `start` says (the lead's
    model, permission mode and tools as its ceiling, as spawn_teammate started it), at most its
    `max_restarts` times; a cancelled one (`agentmesh team s1 stop`, CancelRun) is finished. The
    start is claimed with a compare-and-set on the teammate's `run_id`, as the lead's own
    recovery claims it (agent/capabilities/teams.py), so one of them starts it, once.

    `start_run` is RunRpcs.create: the new run is one like any other, kept going here with no
    client attached, on the agent replica the gateway picks."""

    def __init__(self, memory: MemoryLearning,
                 start_run: Callable[[gateway_pb2.CreateRunRequest, Caller], Awaitable[sessions_pb2.Run]]):
        self._memory = memory
        self._start_run = start_run
        self._tasks: set[asyncio.Task[None]] = set()
        self.closing = False

    def ended(self, run: sessions_pb2.Run) -> None:
        team, mark, name = run.session_id.rpartition(MATE_MARK)
        if not (mark and team) or run.state not in (*_RESTARTED, "cancelled") or self.closing:
            return
        task = asyncio.create_task(self._recover(_copy_run(run), team, name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, grace_s: float = 0.0) -> None:
        """On drain: no new starts from a gateway going away (the teammate's own watch, a lead's
        turn or the next gateway start it)."""
        self.closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _recover(self, run: sessions_pb2.Run, team: str, name: str) -> None:
        try:
            await self._recover_once(run, team, name)
        except _Taken:
            return
        except Exception as exc:  # noqa: BLE001 - a background recovery logs; the lead's turn is the fallback
            log.warning("teammate not recovered", team=team, name=name, run_id=run.run_id, error=str(exc))

    async def _recover_once(self, run: sessions_pb2.Run, team: str, name: str) -> None:
        memory, namespace = self._memory, run.namespace or "default"
        found = (await team_records(memory, namespace, team, "mate")).get(name)
        if found is None:
            return
        mate = found[1]
        start = mate.get("start")
        if str(mate.get("run_id", "")) != run.run_id or mate.get("state") in ("finished", "starting"):
            return  # not (or no longer) this teammate's current run
        if run.state == "cancelled":
            await swap_record(memory, namespace, team, "mate", name,
                              self._claim(run.run_id, state="finished", stop_reason="cancelled"))
            await post_mail(memory, namespace, team, "lead", name,
                            f"[{name} finished (cancelled)] {mate.get('last_message') or '(no answer)'}")
            return
        if not isinstance(start, dict):
            return  # spawned by an agent that records no start: its lead's turn restarts it
        error = run.error_message or run.state
        restarts = int(mate.get("restarts", 0))
        if restarts >= int(start.get("max_restarts", 2)):
            note = f"its run {run.run_id} failed ({error}) after {restarts} restarts"
            await swap_record(memory, namespace, team, "mate", name, self._claim(
                run.run_id, state="finished", stop_reason="failed", last_message=note[:500]))
            await post_mail(memory, namespace, team, "lead", name, f"[{name} finished (failed)] {note}")
            log.warning("teammate given up", team=team, name=name, run_id=run.run_id)
            return
        await swap_record(memory, namespace, team, "mate", name,
                          self._claim(run.run_id, state="starting", run_id="", restarts=restarts + 1))
        session_id = str(mate.get("session_id") or run.session_id)
        options = gateway_pb2.ChatOptions(
            model=str(start.get("model", "")), permission_mode=str(start.get("permission_mode", "")),
            max_iterations=int(start.get("max_iterations", 0)), token_budget=int(start.get("token_budget", 0)),
            tools=common_pb2.ToolPolicy(allow=list(start.get("allow", [])), deny=list(start.get("deny", []))))
        request = gateway_pb2.CreateRunRequest(session_id=session_id, message=RESUME.format(error=error[:500]),
                                               options=options)
        # The teammate's turns stay spans of its lead's trace (spawn_teammate kept the context).
        token = otel_context.attach(propagate.extract(dict(start.get("trace", {}))))
        try:
            started = await self._start_run(request, Caller(subject=run.started_by or "user:anonymous"))
        except AgentmeshError as exc:
            why = exc.message
            await swap_record(memory, namespace, team, "mate", name, lambda body: {
                **(body or {"name": name}), "state": "finished", "stop_reason": "not_restarted",
                "last_message": why[:500], "updated_at": time.time()})
            await post_mail(memory, namespace, team, "lead", name, f"[{name} finished (failed)] not restarted: {why}")
            return
        finally:
            otel_context.detach(token)
        await swap_record(memory, namespace, team, "mate", name, lambda body: {
            **(body or {"name": name}), "run_id": started.run_id, "state": "started", "updated_at": time.time()})
        log.info("teammate restarted by the gateway", team=team, name=name, failed_run=run.run_id,
                 run_id=started.run_id)

    @staticmethod
    def _claim(expected: str, **fields: Any) -> Callable[[dict[str, Any] | None], dict[str, Any]]:
        def claim(body: dict[str, Any] | None) -> dict[str, Any]:
            if body is None or body.get("run_id") != expected or body.get("state") in ("finished", "starting"):
                raise _Taken
            return {**body, **fields, "updated_at": time.time()}
        return claim


def _copy_run(run: sessions_pb2.Run) -> sessions_pb2.Run:
    copy = sessions_pb2.Run()
    copy.CopyFrom(run)
    return copy
