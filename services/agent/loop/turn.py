"""The seam between the loop and what plugs into a turn.

A **capability** (deep work, compaction, sub-agents, …) is a small object the loop builds for
each turn it applies to. It sees the turn only through a `TurnContext` — the request, the
settings, the running usage, and five actions (`emit`, `call_model`, `persist`, `inject`, `start_child`)
— and the loop calls its hooks at fixed points:

    load()                          once, as the turn starts, at the same time as the loop's own
                                    start-up reads (turn_start.py: history, tool catalog,
                                    recall): the capability's own reads (standing instructions,
                                    skills — served from what StartTurn brought, learning.py)
    prepare_history(history)        once, before anything else: the history the turn starts from
    before_first_call(turn)         once, before the first tool-using step; may return `Stop`
    before_step(step, turn)         before each tool-using step (from 1)
    view(messages)                  every model call: this turn's messages as the model sees them
    system_sections()               every model call: text for the system prompt, after the base
                                    prompt, in capability order (standing instructions, skills)
    after_reply(step, reply, turn)  after each step's reply is persisted, before its tools run:
                                    None to go on, `Nudge` (text-only replies) or `Stop`
    after_turn(stop_reason)         once, however the turn ended (also cancelled or failed)

and, for the tools it executes itself, `tools()` (offered to the model; asked again before each
step, so a tool gained mid-turn is offered from the next step) and `execute(call)`.
The loop owns the turn's state; a capability keeps its own and never reaches into the loop.
See docs/agent.md, "Adding a capability".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable

from agentmesh.agent.loop.approvals import ApprovalGate
from agentmesh.agent.loop.ports import MemoryHit, TurnLearning
from agentmesh.agent.loop.usage_log import UsageTag
from agentmesh.agent.loop.window import ContextBudget
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import ChatMessage, ModelReply, RunEvent, ToolCall, ToolOutcome, ToolSpec, Usage

__all__ = ["Capability", "Nudge", "Stop", "TurnContext", "Verdict"]

if TYPE_CHECKING:  # the loop imports this module; only its types are needed here
    from agentmesh.agent.loop.model_choice import NamedModel
    from agentmesh.agent.loop.run import Agent, TurnRun
    from agentmesh.agent.loop.turn_request import TurnRequest


@dataclass
class TurnContext:
    """What a capability may see and do of a running turn. Built by the loop, one per turn."""

    request: "TurnRequest"
    settings: AgentSettings
    agent: "Agent"  # the services shared by all turns: provider, tools, transcripts, memory, telemetry
    model: str
    usage: Usage  # the turn's running token count; a capability adds what it spends elsewhere
    step_budget: int  # tool-using steps the turn may take
    approvals: ApprovalGate
    # Send one event to the turn's stream.
    emit: Callable[[RunEvent], None]
    # One model call: `turn` (this turn's messages) goes through every capability's `view`, then
    # `extra` (e.g. a system note asking for something) is appended; history, system prompt,
    # tools and the budget policy are the loop's. Counts in `iterations` and `usage`.
    call_model: Callable[..., Awaitable[ModelReply]]
    # Durably append messages to the session's transcript.
    persist: Callable[[list[ChatMessage]], Awaitable[None]]
    # Add messages to this turn (from `before_first_call` / `before_step`): persisted, and seen by
    # this step's call and every later one, like the turn's own messages.
    inject: Callable[[list[ChatMessage]], Awaitable[None]]
    # A child turn (a sub-agent) that shares this turn's approval gate.
    start_child: Callable[["TurnRequest"], "TurnRun"]
    # Who this turn's model calls are for, for the usage ledger: a capability that calls a model
    # itself (compaction) passes `usage_tag.for_model(...)` to `traced_model_call`.
    usage_tag: UsageTag
    # Where this turn's learning capabilities read the namespace's standing instructions, skills
    # and promoted tools (the agent's sources, their first reads served by the turn's start).
    learning: TurnLearning | None = None
    # The session's stored transcript as loaded (every entry, of every kind), before `prepare_history`.
    stored: list[ChatMessage] = field(default_factory=list)
    # Filled in by the loop before `before_first_call`.
    history: list[ChatMessage] = field(default_factory=list)
    tools: list[ToolSpec] = field(default_factory=list)
    memories: list[MemoryHit] = field(default_factory=list)
    # The tools service's whole catalogue for the namespace (built-in, MCP, remote agents) before
    # any tool policy — `tools` is what the policies leave. None until the turn's start has read
    # it, and when it could not be read. What a self-made tool may never be named after.
    catalog: list[ToolSpec] | None = None
    # The context budget of the turn's next model call, from its model's window (window.py).
    budget: Callable[[], ContextBudget] = field(default=lambda: ContextBudget.of(32_768, max_tokens=0,
                                                                                   chars_per_token=3.0))
    # How full the last request left the window: (estimated tokens sent, window tokens).
    fill: tuple[int, int] = (0, 0)
    # The characters the next call would send for `turn`, before the budget policy trims anything:
    # (system prompt and tools, history and the turn through every `view`).
    measure: Callable[[list[ChatMessage]], tuple[int, int]] = field(default=lambda turn: (0, 0))
    # The catalogue model the turn is talking to now (after any fallback).
    current_model: Callable[[], "NamedModel"] = field(default=lambda: None)  # type: ignore[assignment]  # set by the turn's model call before any capability asks


@dataclass(frozen=True)
class Nudge:
    """After a text-only reply: do not end the turn; add `note` (a system message, sent but not
    stored) and take another step."""

    note: str


@dataclass(frozen=True)
class Stop:
    """End the turn now with `stop_reason`; the reply's tool calls (if any) are not run."""

    stop_reason: str
    final_text: str = ""
    # The result recorded for each call that is not run.
    not_run: str = "error: not run: the turn was stopped"


Verdict = Nudge | Stop | None


class Capability:
    """Base class: every hook does nothing. Override what the capability needs."""

    def __init__(self, ctx: TurnContext):
        self.ctx = ctx

    def tools(self) -> list[ToolSpec]:
        """Tools this capability executes itself (offered to the model beside the remote ones)."""
        return []

    async def execute(self, call: ToolCall) -> ToolOutcome:
        """Run a call to one of `tools()`. Return an error outcome rather than raising."""
        raise NotImplementedError(call.name)

    async def load(self) -> None:
        """Read what the turn needs before its first call; runs concurrently with the loop's own
        reads and the other capabilities' `load`. Must not raise for a read that fails: note it
        (a status event) and go on without."""

    async def prepare_history(self, history: list[ChatMessage]) -> list[ChatMessage]:
        return history

    async def before_first_call(self, turn: list[ChatMessage]) -> "Stop | None":
        """May return `Stop` to end the turn before any step (plan mode, when the plan is rejected)."""
        return None

    async def before_step(self, step: int, turn: list[ChatMessage]) -> None:
        pass

    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """This turn's messages as the model should see them; must not change the list passed in."""
        return messages

    def system_sections(self) -> list[str]:
        """Text this capability adds to the system prompt, right after the base prompt."""
        return []

    async def after_reply(self, step: int, reply: ModelReply, turn: list[ChatMessage]) -> Verdict:
        return None

    async def after_turn(self, stop_reason: str) -> None:
        pass
