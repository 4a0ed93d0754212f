"""Teams (docs/teams.md): a lead turn spawns teammates — agent runs of their own, each in a child
session `<lead>.mate-<name>`, started through the gateway so they run on any agent replica with no
client attached — and lead and teammates talk through durable mailboxes and share one task board
(team_board.py). Their state is memory's (team_store.py), so a teammate resumed on another
replica carries on from its transcript and mailbox.

    lead turn ── spawn_teammate(name, role, task) ──▶ Gateway.CreateRun(<lead>.mate-<name>)
       │  send_message / broadcast / read_inbox        teammate turn (any agent replica)
       │  shutdown_request / plan_review                 inbox injected before each model call
       └─ shared board: task_* and task_claim            idle: waits for mail or a free task

A teammate has the lead's model, permission mode and tools as its ceiling (the tools the lead's
turn was offered are its allow list), cannot spawn teammates, and ends after `team_idle_s` with
nothing to do, or when it approves the lead's shutdown request. Protocols (shutdown, plan
approval) are records with an id and a state (pending, approved, rejected) that either side
reads with check_protocol; each request and answer also arrives as mail.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Coroutine

from agentmesh.agent.capabilities.tasks import Board
from agentmesh.agent.capabilities.team_board import SharedTaskBoard, claimable
from agentmesh.agent.capabilities.team_recovery import recover, start_record, watch_run
from agentmesh.agent.capabilities.team_specs import LEAD_SPECS, MATE_SPECS, SCHEMAS
from agentmesh.agent.capabilities.team_store import (
    LEAD,
    NAME,
    Team,
    TeammateRuns,
    TeammateStart,
    delivered_in,
    mate_session,
    render_mail,
)
from agentmesh.agent.loop.turn import Capability, Nudge, TurnContext, Verdict
from agentmesh.agent.types import ChatMessage, ModelReply, TeammateStatusEvent, ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger
from agentmesh.toolpolicy import AGENT_TOOLS, MAX_ENTRIES, allowed_by_all

__all__ = ["TeamLead", "TeamMember", "Teammate", "status_event"]

log = get_logger("agentmesh.agent.teams")

FINISHED = "finished"
LAST_CHARS = 500

MATE_NOTE = (
    "You are {name}, a teammate with the role: {role}. You work in a team led by another agent (`lead`), beside "
    "other teammates, in a session of your own. The team shares one task board: take a task with task_claim, mark "
    "it done with task_update, and take the next. Messages sent to you appear as `[mail N from X]` before your "
    "next step; send_message reaches one member, broadcast all. Report your results to the lead with "
    "send_message before you end. When you have nothing left to do, end your reply: you are woken when a message "
    "or a free task arrives."
)


class _Superseded(Exception):
    """The teammate's record belongs to another run of it now, or it was finished."""


# Watches that outlive the turn that started them (Teammate.after_turn), held until they end.
_WATCHES: set[asyncio.Task[None]] = set()


def _detach(watch: Coroutine[Any, Any, None]) -> None:
    task = asyncio.create_task(watch)
    _WATCHES.add(task)
    task.add_done_callback(_watch_ended)


def _watch_ended(task: asyncio.Task[None]) -> None:
    # Nobody awaits a detached watch: its failure (e.g. the service stopping under it, its
    # channel to the gateway closed) is said here rather than lost as "never retrieved".
    _WATCHES.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("teammate's run no longer watched", error=str(error) or type(error).__name__)


def status_event(mate: dict[str, Any]) -> TeammateStatusEvent:
    return TeammateStatusEvent(
        name=str(mate["name"]), state=str(mate.get("state", "")), session_id=str(mate.get("session_id", "")),
        run_id=str(mate.get("run_id", "")), role=str(mate.get("role", "")),
        current_task=str(mate.get("current_task", "")), last_message=str(mate.get("last_message", "")),
        input_tokens=int(mate.get("input_tokens", 0)), output_tokens=int(mate.get("output_tokens", 0)))


class TeamMember(Capability):
    """What the lead and a teammate share: mail, protocol checks, their cursor in the mailbox."""

    def __init__(self, ctx: TurnContext, team: Team, me: str, board: SharedTaskBoard):
        super().__init__(ctx)
        self.team, self.me, self.board = team, me, board
        self.cursor = 0
        self.change = 0

    async def prepare_history(self, history: list[ChatMessage]) -> list[ChatMessage]:
        # What this session's transcript holds was delivered: only what comes after is new.
        self.cursor = delivered_in(self.ctx.stored)
        return history

    def _ok(self, call: ToolCall, output: str, **data: Any) -> ToolOutcome:
        return ToolOutcome(call_id=call.call_id, name=call.name, output=output, data=data)

    async def execute(self, call: ToolCall) -> ToolOutcome:
        try:
            args = SCHEMAS[call.name].parse(call.arguments_json)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        try:
            return await self._run(call, args)
        except ValueError as exc:
            return ToolOutcome.error(call, "team_refused", f"error: {call.name}: {exc}")
        except AgentmeshError as exc:
            return ToolOutcome.error(call, "team_unavailable", f"error: {call.name}: {exc.message}")

    async def _run(self, call: ToolCall, args: dict[str, Any]) -> ToolOutcome:
        if call.name == "send_message":
            to = args["to"]
            if to == self.me:
                raise ValueError("that is you; send to a teammate or `lead`")
            if to != LEAD and await self.team.get("mate", to) is None:
                raise ValueError(f"there is no teammate {to!r} (teammates: {await self._names()})")
            seq = await self.team.post(to, self.me, args["text"])
            return self._ok(call, f"Sent to {to} (message {seq} of its inbox).", to=to, seq=seq)
        if call.name == "broadcast":
            members = [n for n in [LEAD, *(m["name"] for m in await self.team.mates())] if n != self.me]
            for name in members:
                await self.team.post(name, self.me, args["text"])
            return self._ok(call, f"Sent to {', '.join(members) or 'nobody (no one else in the team)'}.",
                            to=members)
        if call.name == "read_inbox":
            return await self._read_inbox(call, float(args.get("wait_s", 0)))
        if call.name == "check_protocol":
            record = await self.team.get("protocol", args["request_id"])
            if record is None:
                raise ValueError(f"there is no request {args['request_id']!r}")
            body = record.body
            note = f" Note: {body['note']}" if body.get("note") else ""
            return self._ok(call, f"{body['type']} request {body['id']} from {body['from']} to {body['to']}: "
                            f"{body['state']}.{note}", **{k: body.get(k) for k in ("id", "type", "state", "note")})
        raise ValueError(f"unknown tool {call.name}")

    async def _names(self) -> str:
        return ", ".join(m["name"] for m in await self.team.mates()) or "none"

    async def take_mail(self) -> str:
        """The messages after the cursor, rendered (the caller's write of them marks them delivered)."""
        mail = await self.team.mail_after(self.me, self.cursor)
        if not mail:
            return ""
        self.cursor = max(m.seq for m in mail)
        return render_mail(mail)

    async def _read_inbox(self, call: ToolCall, wait_s: float) -> ToolOutcome:
        deadline = time.monotonic() + min(wait_s, self.ctx.settings.team_inbox_wait_s)
        while True:
            text = await self.take_mail()
            remaining = deadline - time.monotonic()
            if text or remaining <= 0:
                break
            await self.observe()
            self.change = await self.team.wait(self.change, min(remaining, self.ctx.settings.team_check_s))
        await self.observe()
        return self._ok(call, text or "(no new messages)")

    async def observe(self) -> None:
        """The lead shows its teammates' changes of state on its stream (TeamLead)."""

    async def _protocol(self, kind: str, sender: str, to: str, **fields: Any) -> str:
        request_id = f"{'sd' if kind == 'shutdown' else 'plan'}-{uuid.uuid4().hex[:8]}"
        body = {"id": request_id, "type": kind, "from": sender, "to": to, "state": "pending", "note": "",
                "created_at": time.time(), **fields}
        await self.team.change("protocol", request_id, lambda current: current or body)
        return request_id

    async def _answer(self, request_id: str, kind: str, approve: bool, note: str) -> dict[str, Any]:
        def answer(body: dict[str, Any] | None) -> dict[str, Any]:
            if body is None or body.get("type") != kind:
                raise ValueError(f"there is no {kind} request {request_id!r}")
            if body.get("to") != self.me:
                raise ValueError(f"request {request_id} is addressed to {body.get('to')}, not to you")
            if body["state"] != "pending":  # the first answer holds: the lead's, or a person's (team API)
                raise ValueError(f"request {request_id} was answered already ({body['state']})")
            return {**body, "state": "approved" if approve else "rejected", "note": note, "answered_at": time.time()}
        return await self.team.change("protocol", request_id, answer)


class TeamLead(TeamMember):
    """The lead's side: spawning, watching and directing teammates."""

    def __init__(self, ctx: TurnContext, team: Team, board: SharedTaskBoard, runs: TeammateRuns):
        super().__init__(ctx, team, LEAD, board)
        self.runs = runs
        self._spawning = asyncio.Lock()
        self.seen: dict[str, tuple[str, str]] = {}
        self._next_check = 0.0

    def tools(self) -> list[ToolSpec]:
        return list(LEAD_SPECS)

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        if self.board.shared:
            await self.observe()

    async def observe(self) -> None:
        try:
            mates = await self.team.mates()
            if time.monotonic() >= self._next_check:
                self._next_check = time.monotonic() + self.ctx.settings.team_check_s
                await self._recover(mates)
        except AgentmeshError:
            return
        for mate in mates:
            state = (str(mate.get("state", "")), str(mate.get("current_task", "")))
            if self.seen.get(mate["name"]) != state:
                self.seen[mate["name"]] = state
                self.ctx.emit(status_event(mate))

    async def _run(self, call: ToolCall, args: dict[str, Any]) -> ToolOutcome:
        if call.name == "spawn_teammate":
            # A reply's calls run at once: one spawn at a time, so each sees the ones before it
            # under the caps (two leads of a namespace spawning in the same instant may pass it by one).
            async with self._spawning:
                return await self._spawn(call, args["name"], args["role"].strip(), args["task"].strip())
        if call.name == "list_teammates":
            return self._ok(call, await self._listing())
        if call.name == "shutdown_request":
            name = args["name"]
            mate = await self.team.get("mate", name)
            if mate is None:
                raise ValueError(f"there is no teammate {name!r} (teammates: {await self._names()})")
            request_id = await self._protocol("shutdown", LEAD, name)
            await self.team.post(name, LEAD, f"[shutdown request {request_id}] The lead asks you to stop. Answer "
                                 f"with shutdown_response(request_id={request_id!r}, approve, note).")
            return self._ok(call, f"Asked {name} to stop: request {request_id} (pending). Its answer arrives in "
                            "your inbox.", request_id=request_id)
        if call.name == "plan_review":
            request_id, approve, note = args["request_id"], bool(args["approve"]), args.get("note", "")
            body = await self._answer(request_id, "plan", approve, note)
            verdict = "approved" if approve else "rejected"
            text = f"[plan {request_id} {verdict}] " + (note or ("Go ahead." if approve else "Revise it."))
            await self.team.post(str(body["from"]), LEAD, text)
            return self._ok(call, f"Plan {request_id} of {body['from']} {verdict}.", request_id=request_id,
                            state=body["state"])
        return await super()._run(call, args)

    async def _spawn(self, call: ToolCall, name: str, role: str, task: str) -> ToolOutcome:
        request, settings = self.ctx.request, self.ctx.settings
        if name == LEAD or not NAME.match(name):
            raise ValueError(f"{name!r} cannot be a teammate's name: use lower-case letters, digits and '-', not 'lead'")
        mates = {m["name"]: m for m in await self.team.mates()}
        if name in mates and mates[name].get("state") != FINISHED:
            raise ValueError(f"teammate {name} exists already ({mates[name].get('state')}); message it instead")
        running = [n for n, m in mates.items() if m.get("state") != FINISHED]
        if len(running) >= settings.team_max_teammates:
            raise ValueError(f"the team already has {len(running)} teammates, its limit "
                             f"(AGENTMESH_AGENT_TEAM_MAX_TEAMMATES); message or stop one first")
        everywhere = await self.team.store.records(request.namespace, "", "mate")
        busy = sum(1 for r in everywhere if r.body.get("state") != FINISHED)
        if busy >= settings.team_max_per_namespace:
            raise ValueError(f"namespace {request.namespace} already runs {busy} teammates, its limit "
                             "(AGENTMESH_AGENT_TEAM_MAX_PER_NAMESPACE); wait for some to finish")
        await self.board.publish()
        session_id = mate_session(request.session_id, name)
        sessions = self.ctx.agent.sessions
        if sessions is not None:
            await sessions.open_child(session_id, parent_session_id=request.session_id, namespace=request.namespace,
                                      title=f"teammate {name} ({role})"[:200])
        start = self._start(session_id, f"Your role: {role}\n\nYour task: {task}")
        # Its `start` lets whoever sees its run fail start it again the same way (team_recovery.py).
        await self.team.set_mate(name, role=role, task=task, session_id=session_id, state="starting",
                                 current_task="", last_message="", input_tokens=0, output_tokens=0, run_id="",
                                 restarts=0, start=start_record(start, settings.team_restarts))
        try:
            run_id = await self.runs.start(start)
        except AgentmeshError as exc:
            # Not started: it must not hold a place under the team's cap.
            await self.team.set_mate(name, state=FINISHED, stop_reason="not_started", last_message=exc.message)
            raise
        await self.team.set_mate(name, run_id=run_id, state="started")
        await self.observe()
        log.info("teammate started", team=request.session_id, name=name, run_id=run_id)
        return self._ok(call, f"Teammate {name} started (session {session_id}, run {run_id}).",
                        name=name, session_id=session_id, run_id=run_id)

    async def _recover(self, mates: list[dict[str, Any]]) -> None:
        """Act on each teammate whose run ended without it finishing — its agent replica died
        mid-turn, its turn failed, its gateway was lost, it was cancelled (team_recovery.py):
        started again in its own session, from its transcript and mailbox cursor, at most
        `team_restarts` times. The gateway does the same where it sees the run end; whoever
        claims the teammate's record first acts."""
        for mate in mates:
            run_id = str(mate.get("run_id", ""))
            if not run_id or mate.get("state") in (FINISHED, "starting"):
                continue
            state, error = await self.runs.state(run_id)
            # A teammate spawned before records kept their `start` is started as this turn would.
            fallback = None if isinstance(mate.get("start"), dict) else self._start(str(mate.get("session_id", "")), "")
            await recover(self.team, self.runs, mate, state, error, fallback, self.ctx.settings.team_restarts)

    def _start(self, session_id: str, message: str) -> TeammateStart:
        request = self.ctx.request
        allow, deny = self._ceiling()
        return TeammateStart(session_id=session_id, namespace=request.namespace, message=message, model=request.model,
                             permission_mode=request.permission_mode, allow=allow, deny=deny,
                             max_iterations=self.ctx.settings.team_max_iterations, token_budget=request.token_budget)

    def _ceiling(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The teammate's tool policy layer: every tool the lead's turn may not use, denied — the
        catalog's tools it was not offered and the agent's own its policies refuse. A deny list
        longer than a policy may hold becomes the allow list of what the lead was offered."""
        offered = {t.name for t in self.ctx.tools}
        refused = {n for n in AGENT_TOOLS if not allowed_by_all(self.ctx.request.tool_policies, n)}
        deny = sorted(({t.name for t in self.ctx.catalog or ()} - offered) | refused)
        if len(deny) <= MAX_ENTRIES:
            return (), tuple(deny)
        mine = {s.name for s in MATE_SPECS} | {t.name for t in self.board.tools()} | {"task_claim"}
        allow = sorted((offered | mine) - refused)
        if len(allow) > MAX_ENTRIES:
            raise ValueError(f"your tools cannot be passed on as a teammate's ceiling (more than {MAX_ENTRIES} to "
                             "allow and to deny); narrow this session's tool policy first")
        return tuple(allow), ()

    async def _listing(self) -> str:
        mates = await self.team.mates()
        if not mates:
            return "(no teammates yet)"
        lines = []
        for m in mates:
            tokens = int(m.get("input_tokens", 0)) + int(m.get("output_tokens", 0))
            task = f", on {m['current_task']}" if m.get("current_task") else ""
            last = f"; last: {m['last_message'][:200]}" if m.get("last_message") else ""
            lines.append(f"- {m['name']} ({m.get('role', '')}): {m.get('state', '?')}{task}, {tokens} tokens{last}")
        return "\n".join(lines)


class Teammate(TeamMember):
    """A teammate's side: its inbox before each model call, waiting when idle, its protocols."""

    def __init__(self, ctx: TurnContext, team: Team, name: str, board: SharedTaskBoard,
                 runs: TeammateRuns | None = None):
        super().__init__(ctx, team, name, board)
        self.runs = runs
        self.role = ""
        self.member = False
        self.exiting = False
        self.last_text = ""
        self.free_seen: set[int] = set()  # the board's free tasks at the last look while idle

    async def prepare_history(self, history: list[ChatMessage]) -> list[ChatMessage]:
        history = await super().prepare_history(history)
        mate = await self.team.get("mate", self.me)
        # A session named like a teammate's is one only when its team has it.
        self.member = mate is not None
        self.role = str(mate.body.get("role", "")) if mate else ""
        return history

    def tools(self) -> list[ToolSpec]:
        return list(MATE_SPECS) if self.member else []

    def system_sections(self) -> list[str]:
        return [MATE_NOTE.format(name=self.me, role=self.role)] if self.member else []

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        if not self.member:
            return
        if step == 1:
            await self._state("working")
        text = await self.take_mail()
        if text:
            # One write holds the mail and, by its marks, says it was delivered (team_store.py).
            await self.ctx.inject([ChatMessage(role="user", content=text, run_id=self.ctx.request.run_id)])

    async def after_reply(self, step: int, reply: ModelReply, turn: list[ChatMessage]) -> Verdict:
        if not self.member or reply.tool_calls:
            return None
        self.last_text = reply.text.strip() or self.last_text
        if self.exiting:
            return None
        await self._state("idle", last_message=self.last_text[:LAST_CHARS])
        if await self._wait_for_work():
            await self._state("working")
            return Nudge("New mail or a free task on the board arrived: read it and carry on.")
        return None

    async def _wait_for_work(self) -> bool:
        deadline = time.monotonic() + self.ctx.settings.team_idle_s
        while True:
            if await self.team.mail_after(self.me, self.cursor):
                return True
            record = await self.team.get("board", "board")
            free = set(claimable(Board.from_json(record.body["board"]))) if record is not None else set()
            # Only a task that became free since the last look wakes it: one it was woken for and
            # left would wake it at every look, and it would spend its turn's budget answering.
            fresh, self.free_seen = free - self.free_seen, free
            if fresh:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.change = await self.team.wait(self.change, remaining)

    async def after_turn(self, stop_reason: str) -> None:
        if not self.member or stop_reason == "error":
            # A failed run is started again by whoever sees it end (the gateway, the lead:
            # team_recovery.py) — as is one whose replica died and never got here; until then it
            # keeps its place in the team.
            return
        if stop_reason == "cancelled":
            # Cancelled under it: a stop asked for (`team stop`), or its gateway went away
            # mid-turn. Its run's record tells which, once a gateway answers: watched from here.
            if self.runs is not None:
                _detach(watch_run(self.team, self.runs, self.me, self.ctx.request.run_id))
            return
        try:
            await self._state(FINISHED, stop_reason=stop_reason, last_message=self.last_text[:LAST_CHARS])
            await self.team.post(LEAD, self.me, f"[{self.me} finished ({stop_reason})] {self.last_text or '(no answer)'}")
        except AgentmeshError as exc:
            log.warning("teammate's end not recorded", name=self.me, error=exc.message)

    async def _state(self, state: str, **fields: Any) -> None:
        usage = self.ctx.usage
        mine = [t for t in self.board.board.tasks.values() if t.owner == self.me and t.status == "in_progress"]
        run_id = self.ctx.request.run_id
        changes = {"state": state, "run_id": run_id, "current_task": f"#{mine[0].id} {mine[0].subject}" if mine else "",
                   "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens, **fields}

        def update(body: dict[str, Any] | None) -> dict[str, Any]:
            # A write of a run that no longer is the teammate's — stopped, or started again
            # meanwhile by whoever saw it end — lands on nothing (team_recovery.py decides then).
            if body is not None and (body.get("state") == FINISHED or body.get("run_id") not in ("", run_id)):
                raise _Superseded
            return {**(body or {"name": self.me}), **changes, "updated_at": time.time()}
        try:
            await self.team.change("mate", self.me, update)
        except _Superseded:
            log.info("teammate's state not written: its run was ended or replaced", name=self.me, run_id=run_id)

    async def _run(self, call: ToolCall, args: dict[str, Any]) -> ToolOutcome:
        if call.name == "submit_plan":
            request_id = await self._protocol("plan", self.me, LEAD, plan=args["plan"])
            await self.team.post(LEAD, self.me, f"[plan request {request_id}] {args['plan']}\n(answer with "
                                 f"plan_review(request_id={request_id!r}, approve, note))")
            return self._ok(call, f"Plan submitted as request {request_id} (pending): wait for the lead's answer "
                            "in your inbox.", request_id=request_id)
        if call.name == "shutdown_response":
            approve, note = bool(args["approve"]), args.get("note", "")
            await self._answer(args["request_id"], "shutdown", approve, note)
            verdict = "approved" if approve else "declined"
            await self.team.post(LEAD, self.me, f"[shutdown {args['request_id']} {verdict}] {note}".rstrip())
            self.exiting = approve
            return self._ok(call, "Shutdown approved: finish this reply and you stop." if approve
                            else "Shutdown declined; the lead is told.", state=verdict)
        return await super()._run(call, args)
