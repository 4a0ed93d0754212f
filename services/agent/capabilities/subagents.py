"""Sub-agents: the `delegate_task` tool, which the agent executes itself by running a child turn.

    parent turn ── delegate_task(task, instructions?, max_iterations?) ──▶ child TurnRun
                                                                            same provider, tools, memory
                                                                            its own session "<parent>.sub-<hash>"
                                                                            the parent's workspace and approval gate

A reply may hold several `delegate_task` calls; the loop runs a reply's calls concurrently, so
several sub-agents work in parallel. What each child does is visible twice over: its transcript
is durable in its own session (`agentmesh sessions show <child id>`), and its progress reaches
the parent's stream as status events ("sub-agent 1 (research the API): calling web_fetch").

The child's answer — its final text, clipped — is the tool's result. Whatever goes wrong in a
child (its model fails, it runs out of steps or time, its session cannot be opened) becomes an
error result the parent's model reads; the parent turn never fails because of a child.
Cancelling the parent cancels the children (their tasks are cancelled with the tool call).

A sub-agent may be a named agent of the namespace (docs/agents.md): `delegate_task`'s `agent`
argument names one (the built-ins explore, code, plan, or the namespace's own), and a named parent's
allowed sub-agents are offered as tools of their own, `agent_<name>`, described by the agent's
description. The child then runs that agent's instructions, model, budgets and tool policy — one
more layer on the parent's, so it can only narrow: `explore` under any parent cannot write files.
A named parent delegates only to the agents its `sub_agents` lists.

Recursion is bounded: a child at depth `subagent_max_depth` is not offered the tool, and one
turn starts at most `max_subagents` children.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
from typing import TYPE_CHECKING, Any

from agentmesh.agent.capabilities import budget
from agentmesh.agent.capabilities.tasks import PENDING, BoardError
from agentmesh.agent.loop.context import clip
from agentmesh.agent.loop.session_open import NamedAgent, with_agent
from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.loop.turn_request import SubagentLink
from agentmesh.agent.loop.turn_request import (
    workspace_of as workspace_of,  # skills, promoted tools: subagents.workspace_of
)
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import (
    ApprovalRequestEvent,
    ApprovalResolvedEvent,
    ChatMessage,
    RunErrorEvent,
    RunEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StatusEvent,
    SubagentEvent,
    ToolCall,
    ToolCallEvent,
    ToolOutcome,
    ToolResultEvent,
    ToolSpec,
)
from agentmesh.errors import AgentmeshError
from agentmesh.ids import new_id
from agentmesh.logs import get_logger
from agentmesh.toolargs import ArgumentsSchema

if TYPE_CHECKING:  # only type names: the loop runs this capability, never imports it
    from agentmesh.agent.capabilities.task_tools import TaskBoard
    from agentmesh.agent.loop.run import TurnRun
    from agentmesh.agent.loop.turn_request import TurnRequest

log = get_logger("agentmesh.agent")

MAX_TASK_CHARS = 20_000
MAX_INSTRUCTIONS_CHARS = 8_000
LABEL_CHARS = 40
_SUFFIX = ".sub-"
_DIGEST_CHARS = 10
_MAX_ID = 128
DELEGATE_TASK = "delegate_task"
AGENT_TOOL_PREFIX = "agent_"  # agent_<name>: a named sub-agent offered as a tool of its own

SUBAGENT_NOTE = (
    "You are a sub-agent: another agent delegated one task to you. Do that task with your tools, then end with "
    "one complete, self-contained answer; the delegating agent sees only your final message, not your tool calls "
    "or their output. Files you read and write are in the workspace you share with it. Do not ask questions: "
    "if something blocks you, say what it is and stop."
)


TASK_ID_PROPERTY = {
    "type": "integer",
    "minimum": 1,
    "description": "Optional: the number of a task on your task board that this sub-agent takes on. It is marked "
                   "in_progress for the sub-agent, done when it finishes, and pending again if it does not.",
}


def delegate_spec(settings: AgentSettings, *, with_tasks: bool = False) -> ToolSpec:
    spec = ToolSpec(
        name=DELEGATE_TASK,
        description=(
            "Hand a self-contained task to a sub-agent that works on it with the same tools and workspace and "
            "returns its final answer as this tool's result. Put several calls in one reply to run sub-agents in "
            "parallel (for independent parts of a larger job). The sub-agent sees only what you write in `task`, "
            "so say exactly what to do and what to return."
        ),
        parameters={
            "type": "object",
            "properties": {
                "task": {
                    "type": "string",
                    "maxLength": MAX_TASK_CHARS,
                    "description": "What the sub-agent should do and what it should return, with all context it needs.",
                },
                "instructions": {
                    "type": "string",
                    "maxLength": MAX_INSTRUCTIONS_CHARS,
                    "description": "Optional role and focus for the sub-agent's system prompt, e.g. "
                                   "'You are a meticulous code reviewer; report problems only.'",
                },
                "max_iterations": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": settings.subagent_max_iterations,
                    "description": f"Optional step budget (model calls with tools), at most "
                                   f"{settings.subagent_max_iterations}.",
                },
            },
            "required": ["task"],
            "additionalProperties": False,
        },
    )
    spec.parameters["properties"]["agent"] = {
        "type": "string",
        "maxLength": 80,
        "description": "Optional: a named agent to run the task (explore: read-only search of the workspace; "
                       "code: changes code; plan: writes a plan; or one the namespace defines).",
    }
    if with_tasks:
        spec.parameters["properties"]["task_id"] = TASK_ID_PROPERTY
    return spec


def agent_tool_spec(agent: NamedAgent) -> ToolSpec:
    """A named sub-agent as a tool: its description is what the model reads to choose it."""
    return ToolSpec(
        name=AGENT_TOOL_PREFIX + agent.name.replace("-", "_"),
        description=(agent.description or f"The {agent.name} agent.") + " It works on the task you give it and "
                    "returns its final answer as this tool's result; it sees only what you write in `task`.",
        parameters={"type": "object", "properties": {"task": {
            "type": "string", "maxLength": MAX_TASK_CHARS,
            "description": "What the agent should do and what it should return, with all context it needs."}},
            "required": ["task"], "additionalProperties": False},
    )


def depth_of(request: "TurnRequest") -> int:
    return request.subagent.depth if request.subagent else 0


def offered(request: "TurnRequest", settings: AgentSettings) -> bool:
    """Whether this turn may delegate: within the depth limit and the turn cap, and at the top
    level only in the modes configured for it (a child's own mode is always the default)."""
    depth = depth_of(request)
    if depth >= settings.subagent_max_depth or settings.max_subagents == 0:
        return False
    return depth > 0 or by_mode(request, settings) or runs_named_agent(request)


def by_mode(request: "TurnRequest", settings: AgentSettings) -> bool:
    return depth_of(request) > 0 or (request.mode or "default") in settings.subagent_modes


def runs_named_agent(request: "TurnRequest") -> bool:
    """A turn of a named agent (known before its start resolves it: the opening names it) may
    have sub-agents to offer, in any mode; `Delegation.tools` offers nothing if it has none."""
    return request.agent is not None or bool(request.opening is not None and request.opening.agent)


def child_session_id(parent_session_id: str, run_id: str, call_id: str) -> str:
    """`<parent>.sub-<10 hex>`: derived from the parent's session, run and call, so it is stable
    for one call yet unique across turns (some servers number call ids from 1 in every reply).
    A long parent id is shortened so the child's id stays a valid id (at most 128 characters)."""
    digest = hashlib.sha256(f"{parent_session_id}\0{run_id}\0{call_id}".encode()).hexdigest()[:_DIGEST_CHARS]
    base = parent_session_id[: _MAX_ID - len(_SUFFIX) - _DIGEST_CHARS]
    return f"{base}{_SUFFIX}{digest}"


def child_budget(parent: TurnContext) -> int:
    """A child may spend what is left of its parent's turn budget (0: the parent has none). Its
    usage is added to the parent's when it ends, so the parent's budgets see it."""
    limit = budget.turn_limit(parent)
    return max(limit - parent.usage.total_tokens, 1) if limit else 0


def short(text: str, limit: int = LABEL_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


@functools.lru_cache(maxsize=8)
def delegate_tool(settings: AgentSettings, *, with_tasks: bool) -> tuple[ToolSpec, ArgumentsSchema]:
    """The tool and its checked schema, made once per settings: checking a schema costs more
    than the rest of a turn's start, and every turn of the default mode is offered the tool."""
    spec = delegate_spec(settings, with_tasks=with_tasks)
    return spec, ArgumentsSchema(spec.name, spec.parameters)


class Delegation(Capability):
    """One per parent turn that may delegate: runs each `delegate_task` call as a child turn."""

    def __init__(self, ctx: TurnContext, board: "TaskBoard | None" = None):
        super().__init__(ctx)
        self.settings: AgentSettings = ctx.settings
        self.board = board  # the turn's task board: a sub-agent can be handed one of its tasks
        self.spec, self.schema = delegate_tool(self.settings, with_tasks=board is not None)
        self.started = 0
        self.named: dict[str, NamedAgent] = {}  # tool name -> the named sub-agent it runs

    async def prepare_history(self, history: list[ChatMessage]) -> list[ChatMessage]:
        """A named parent's allowed sub-agents, read here because this hook runs once the turn
        knows its agent (after StartTurn) and before the loop lists the turn's tools."""
        parent, lookup = self.ctx.request.agent, self.ctx.agent.agents
        if parent is None or not parent.sub_agents or lookup is None:
            return history
        try:
            known = {a.name: a for a in await lookup.list(self.ctx.request.namespace)}
        except AgentmeshError as exc:
            self.ctx.emit(StatusEvent(f"could not read the named sub-agents ({exc.message}); delegate_task still works"))
            return history
        for name in parent.sub_agents:
            if name in known:
                spec = agent_tool_spec(known[name])
                self.named[spec.name] = known[name]
        return history

    def tools(self) -> list[ToolSpec]:
        parent = self.ctx.request.agent
        if parent is not None and not parent.sub_agents and not by_mode(self.ctx.request, self.settings):
            return []  # offered only for the named agent's sub-agents, and it has none
        return [self.spec, *(agent_tool_spec(a) for a in self.named.values())]

    async def execute(self, call: ToolCall) -> ToolOutcome:
        named: NamedAgent | None = self.named.get(call.name)
        try:
            if named is not None:
                task, instructions, steps, task_id = self._named_arguments(call)
            else:
                task, instructions, steps, task_id = self._arguments(call)
                ref = self.schema.parse(call.arguments_json).get("agent")
                if ref:
                    named = await self._named(str(ref))
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        except AgentmeshError as exc:
            return ToolOutcome.error(call, "unknown_agent", f"error: {call.name}: {exc.message}")
        cap = self.settings.max_subagents
        if self.started >= cap:
            return ToolOutcome.error(
                call, "too_many_subagents",
                f"error: not run: this turn already started its limit of {cap} sub-agents "
                "(AGENTMESH_AGENT_MAX_SUBAGENTS); do the rest yourself",
            )
        index = self.started + 1
        if task_id and self.board is not None:
            try:  # before any await, so two calls cannot claim one task
                state = self.board.board.get(task_id).status
                if state != PENDING:
                    raise BoardError(f"it is {state}: hand a sub-agent a pending task")
                self.board.board.update(task_id, status="in_progress", owner=f"sub-agent {index}")
            except BoardError as exc:
                return ToolOutcome.error(call, "task_refused", f"error: {call.name}: task #{task_id}: {exc}")
        self.started = index  # before any await: concurrent calls of one reply each get their own number
        if task_id and self.board is not None:
            await self.board.save()
        outcome = await self._delegate(call, task, instructions, steps, index, named)
        if task_id and self.board is not None:
            outcome.output += await self._report(task_id, outcome)
        return outcome

    async def _report(self, task_id: int, outcome: ToolOutcome) -> str:
        """The handed task's new state: done when the sub-agent answered, pending again when not."""
        assert self.board is not None
        done = not outcome.is_error
        self.board.board.update(task_id, status="done" if done else "pending", owner="")
        await self.board.save()
        if done:
            return f"\n[task #{task_id} marked done]"
        return f"\n[task #{task_id} is pending again: the sub-agent did not finish it]"

    def _named_arguments(self, call: ToolCall) -> tuple[str, str, int, int]:
        try:
            task = json.loads(call.arguments_json or "{}").get("task")
        except (ValueError, AttributeError):
            task = None
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"{call.name} needs a `task`: what the agent should do and return")
        return task[:MAX_TASK_CHARS], "", self.settings.subagent_max_iterations, 0

    async def _named(self, ref: str) -> NamedAgent:
        """The named agent `delegate_task` asked for; a named parent may use only its sub-agents."""
        parent, lookup = self.ctx.request.agent, self.ctx.agent.agents
        if lookup is None:
            raise ValueError("named agents are not available in this deployment; leave out `agent`")
        if parent is not None and parent.sub_agents and ref.partition("@")[0] not in parent.sub_agents:
            raise ValueError(f"agent {parent.name!r} may delegate only to {', '.join(parent.sub_agents)}, "
                             f"not {ref!r}")
        return await lookup.get(self.ctx.request.namespace, ref)

    async def _delegate(self, call: ToolCall, task: str, instructions: str, steps: int, index: int,
                        named: NamedAgent | None = None) -> ToolOutcome:
        parent = self.ctx
        preq = parent.request
        child_id = child_session_id(preq.session_id, preq.run_id, call.call_id)
        label = f"sub-agent {index} ({short(task)})"
        link = SubagentLink(
            parent_session_id=preq.session_id, workspace_id=workspace_of(preq), depth=depth_of(preq) + 1,
            index=index, label=label,
        )
        # A named sub-agent's own instructions replace the parent's prompt (its role is its own).
        base_prompt = named.instructions if named else (preq.system_prompt or self.settings.system_prompt)
        prompt = "\n\n".join(p for p in (base_prompt.strip(), SUBAGENT_NOTE,
                                          f"Your role for this task: {instructions}" if instructions else "") if p)
        request = dataclasses.replace(
            preq, session_id=child_id, run_id=new_id("run"), message=task, max_iterations=steps,
            # model: the one the parent's turn named (preq.model), on its own provider.
            system_prompt=prompt, mode="", subagent=link,
            token_budget=child_budget(parent), session_token_budget=0,
            plan=False, plan_auto_approve=False,  # the parent's plan was approved already
            agent=None,
        )
        if named is not None:
            # Its tool policy is one more layer on the parent's (only narrower), its budgets tighten.
            model = named.model if named.model in parent.agent.models else request.model
            request = dataclasses.replace(with_agent(request, named), model=model, system_prompt=prompt)
            parent.emit(StatusEvent(f"{label}: runs agent {named.name} (version {named.version})"))
        sessions = parent.agent.sessions
        if sessions is not None:
            try:
                await sessions.open_child(child_id, parent_session_id=preq.session_id, namespace=preq.namespace,
                                          title=label[:200])
            except AgentmeshError as exc:
                return ToolOutcome.error(call, "subagent_failed",
                                         f"error: {label} could not start: its session was not created ({exc.message})")
        log.info("sub-agent started", child_session_id=child_id, index=index, depth=link.depth)
        parent.emit(self._event("started", call, link, task, request))
        # One gate for the whole tree: a child's held call is announced on the parent's stream and
        # the decision (Gateway.Approve -> parent.decide) reaches the child through it.
        child = parent.start_child(request)
        return await self._follow(call, child, link, steps, task)

    @staticmethod
    def _event(state: str, call: ToolCall, link: SubagentLink, task: str, request: "TurnRequest",
               **end: Any) -> SubagentEvent:
        named = request.agent
        return SubagentEvent(
            state=state, call_id=call.call_id, index=link.index, depth=link.depth, task=short(task, 200),
            session_id=request.session_id, run_id=request.run_id, agent=named.name if named else "",
            agent_version=named.version if named else 0, **end)

    async def _follow(self, call: ToolCall, child: "TurnRun", link: SubagentLink, steps: int,
                      task: str) -> ToolOutcome:
        label = link.label
        finished: RunFinishedEvent | None = None
        failed: RunErrorEvent | None = None
        timeout = self.settings.subagent_timeout_s
        ended = "error"
        try:
            async with asyncio.timeout(timeout):
                async for event in child.events():
                    if isinstance(event, RunFinishedEvent):
                        finished = event
                    elif isinstance(event, RunErrorEvent):
                        failed = event
                    self._relay(label, child, event)
            ended = finished.stop_reason if finished is not None and failed is None else "error"
        except asyncio.CancelledError:
            ended = "cancelled"  # the parent was cancelled, and its children with it
            raise
        except TimeoutError:
            ended = "timeout"
            self.ctx.emit(StatusEvent(f"{label}: stopped after {timeout:g} s"))
            return ToolOutcome.error(call, "timeout", f"error: {label} did not finish within {timeout:g} s "
                                     "(AGENTMESH_AGENT_SUBAGENT_TIMEOUT_S) and was stopped")
        finally:
            # The child's model calls are part of this turn's cost, whatever became of the child.
            self.ctx.usage.add(child.usage)
            # Its end, with what it spent, whatever ended it (a cancelled parent too).
            self.ctx.emit(self._event("finished", call, link, task, child.request, stop_reason=ended,
                                      iterations=child.iterations, usage=dataclasses.replace(child.usage)))
        data = {"session_id": child.request.session_id, "iterations": child.iterations,
                "input_tokens": child.usage.input_tokens, "output_tokens": child.usage.output_tokens}
        if child.request.agent is not None:  # a named sub-agent: which one, at which version
            data |= {"agent": child.request.agent.name, "agent_version": child.request.agent.version}
        if failed is not None or finished is None:
            reason = f"{failed.code}: {failed.message}" if failed else "it ended without an answer"
            outcome = ToolOutcome.error(call, "subagent_failed", f"error: {label} failed ({reason})")
        elif finished.stop_reason == "max_iterations":
            outcome = ToolOutcome.error(
                call, "subagent_limit",
                f"error: {label} used all {steps} of its steps without finishing. Its summary:\n"
                + clip(finished.final_text or "(none)", self.settings.tool_output_chars),
            )
        else:
            text = finished.final_text.strip() or "(the sub-agent finished without an answer)"
            outcome = ToolOutcome(call_id=call.call_id, name=call.name, output=clip(text, self.settings.tool_output_chars))
        outcome.data = {**data, "stop_reason": finished.stop_reason if finished else "error"}
        return outcome

    def _relay(self, label: str, child: "TurnRun", event: RunEvent) -> None:
        """The child's progress as the parent's status events; approvals pass through as they are."""
        emit = self.ctx.emit
        if isinstance(event, (ApprovalRequestEvent, ApprovalResolvedEvent, SubagentEvent)):
            emit(event)  # a sub-agent's own sub-agents are told apart by their depth
        elif isinstance(event, RunStartedEvent):
            emit(StatusEvent(f"{label}: started in session {child.request.session_id}"))
        elif isinstance(event, ToolCallEvent):
            emit(StatusEvent(f"{label}: calling {event.call.name}"))
        elif isinstance(event, ToolResultEvent) and event.result.is_error:
            emit(StatusEvent(f"{label}: {event.result.name} failed ({event.result.error_kind or 'error'})"))
        elif isinstance(event, StatusEvent):
            emit(StatusEvent(f"{label}: {event.message}"))
        elif isinstance(event, RunFinishedEvent):
            emit(StatusEvent(f"{label}: finished ({event.stop_reason}) after {event.iterations} model call(s)"))
        elif isinstance(event, RunErrorEvent):
            emit(StatusEvent(f"{label}: failed ({event.code}: {event.message})"))

    def _arguments(self, call: ToolCall) -> tuple[str, str, int, int]:
        args = self.schema.parse(call.arguments_json)
        task = args["task"].strip()
        if not task:
            raise ValueError(f"{call.name}: 'task' is empty: say what the sub-agent should do and return")
        steps = args.get("max_iterations") or self.settings.subagent_max_iterations
        return task, (args.get("instructions") or "").strip(), steps, args.get("task_id", 0)
