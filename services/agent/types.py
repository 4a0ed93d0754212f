"""Plain data the agent core works with: messages, tool calls and results, usage, events.

These are deliberately free of protobuf and of any provider's wire format. `server.py` and
`adapters/` translate at the edges; the providers translate to OpenAI / Anthropic JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentmesh.images import ImageRef
from agentmesh.tooling import ToolOutcome, ToolSpec

__all__ = [
    "ApprovalRequestEvent",
    "ApprovalResolvedEvent",
    "BackgroundDone",
    "BackgroundResultEvent",
    "ChatMessage",
    "ImageRef",
    "ModelEvent",
    "ModelReply",
    "ModelRequest",
    "ReasoningChunk",
    "ReasoningDeltaEvent",
    "Retrying",
    "Role",
    "RunErrorEvent",
    "RunEvent",
    "RunFinishedEvent",
    "RunStartedEvent",
    "StatusEvent",
    "SubagentEvent",
    "TaskSnapshot",
    "TaskUpdateEvent",
    "TeammateStatusEvent",
    "TextChunk",
    "TextDeltaEvent",
    "ToolCall",
    "ToolCallEvent",
    "ToolOutcome",
    "ToolResultEvent",
    "ToolSpec",
    "Usage",
    "WaitingForSlot",
    "tool_message",
]

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    # The exact JSON text the model produced; parsed only by whoever executes the call.
    arguments_json: str = "{}"

    def arguments(self) -> dict[str, Any]:
        """The arguments as an object; raises ValueError when the model wrote bad JSON."""
        try:
            value = json.loads(self.arguments_json or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos})") from None
        except RecursionError:
            raise ValueError("arguments nest too deeply (arrays and objects within each other)") from None
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object")
        return value


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""  # role == "tool"
    name: str = ""  # role == "tool": the tool's name
    run_id: str = ""
    seq: int = 0  # assigned by the transcript store; 0 for messages not stored yet
    # "summary": a compaction summary (role "system") standing in, for the model, for every
    # stored message up to `covers_through_seq` (see compaction.py). "" for everything else.
    kind: str = ""
    covers_through_seq: int = 0
    # A user's images or a tool result's, by reference (agentmesh.images); their bytes are read
    # only into the copy of the message a model request carries (loop/images.py).
    images: tuple[ImageRef, ...] = ()


def tool_message(outcome: ToolOutcome, run_id: str) -> ChatMessage:
    """The transcript message that hands `outcome` back to the model."""
    return ChatMessage(role="tool", content=outcome.output, tool_call_id=outcome.call_id, name=outcome.name, run_id=run_id,
                       images=outcome.images)


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    # Of input_tokens, those read from the provider's prompt cache, when it reports them.
    cached_input_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: "Usage") -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_input_tokens += other.cached_input_tokens


# --- what a model provider streams while it answers ---------------------------------------


@dataclass(frozen=True)
class TextChunk:
    text: str


@dataclass(frozen=True)
class ReasoningChunk:
    """Part of the model's reasoning (`reasoning_content`, or `<think>` in the content): streamed
    as its own event, never part of the answer's text."""

    text: str


@dataclass(frozen=True)
class Retrying:
    """The provider is about to retry a call that failed before any byte of the answer."""

    attempt: int  # the attempt that failed, from 1
    max_attempts: int
    delay_s: float
    reason: str  # e.g. "HTTP 503", "connection refused"; never contains the key


@dataclass(frozen=True)
class WaitingForSlot:
    """The call waits for one of its model's slots (the model's `max_concurrency` calls are
    running): said to the user, who would otherwise see a turn that hangs for no reason."""

    model: str  # the catalogue's name
    limit: int
    waiting: int  # calls waiting for this model's slots, this one included


@dataclass(frozen=True)
class ModelReply:
    """The complete answer of one model call; always the last item a provider yields."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    model: str = ""  # the model the server says answered, when it says
    finish_reason: str = ""
    reasoning: str = ""  # what the model reasoned before answering (not part of `text`)


ModelEvent = TextChunk | ReasoningChunk | Retrying | WaitingForSlot | ModelReply


@dataclass(frozen=True)
class ModelRequest:
    model: str
    messages: list[ChatMessage]
    tools: list[ToolSpec]
    # False for the final summary call after max_iterations: tools stay declared (some APIs
    # insist when the history holds tool calls) but the model is told not to call them.
    allow_tools: bool = True
    max_tokens: int = 0  # 0: the provider's default
    # Sampling parameters of the model's catalogue entry (agentmesh.models); None: the server's default.
    temperature: float | None = None
    top_p: float | None = None


# --- what a run emits (server.py turns these into agentmesh.v1.Event) ----------------------


@dataclass(frozen=True)
class RunStartedEvent:
    trace_id: str
    # Of a turn that opened its session (session_open.py): its namespace, and whether it was created.
    namespace: str = ""
    session_created: bool = False


@dataclass(frozen=True)
class TextDeltaEvent:
    text: str


@dataclass(frozen=True)
class ReasoningDeltaEvent:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    call: ToolCall


@dataclass(frozen=True)
class ToolResultEvent:
    result: ToolOutcome


@dataclass(frozen=True)
class ApprovalRequestEvent:
    """The call waits for a person's decision; it runs only if approved in time."""

    call: ToolCall
    timeout_s: float


@dataclass(frozen=True)
class ApprovalResolvedEvent:
    call: ToolCall
    approved: bool
    note: str
    decided_by: str  # "user" | "timeout"
    arguments_json: str = ""  # the arguments a person edited the call to run with


@dataclass(frozen=True)
class StatusEvent:
    message: str
    # The context-fill figure (the turn's last status): tokens of its last request, the window.
    context_tokens: int = 0
    context_window: int = 0


@dataclass(frozen=True)
class TaskSnapshot:
    id: int
    subject: str
    description: str
    status: str  # "pending" | "in_progress" | "done" | "cancelled"
    owner: str
    blocked_by: tuple[int, ...]
    blocked: bool  # waits for a task that is not done


@dataclass(frozen=True)
class TaskUpdateEvent:
    """The session's whole task board, after a change."""

    tasks: tuple[TaskSnapshot, ...]


@dataclass(frozen=True)
class TeammateStatusEvent:
    """One of the lead's teammates changed state (capabilities/teams.py)."""

    name: str
    state: str
    session_id: str
    run_id: str
    role: str = ""
    current_task: str = ""
    last_message: str = ""
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class SubagentEvent:
    """A sub-agent started or finished (capabilities/subagents.py), on its parent's stream."""

    state: str  # "started" | "finished"
    call_id: str
    index: int
    depth: int
    task: str
    session_id: str
    run_id: str
    agent: str = ""
    agent_version: int = 0
    # When finished: how it ended ("completed", ..., "error", "timeout"), its steps and usage.
    stop_reason: str = ""
    iterations: int = 0
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class BackgroundDone:
    """A background command (background_run) that ended: ran to its end, past its lifetime, or was stopped."""

    id: str
    command: str
    status: str  # "finished" | "stopped"
    result: ToolOutcome
    seconds: float


@dataclass(frozen=True)
class BackgroundResultEvent:
    done: BackgroundDone


@dataclass(frozen=True)
class RunFinishedEvent:
    usage: Usage
    iterations: int
    final_text: str
    trace_id: str
    stop_reason: str  # "completed" | "max_iterations" | "cancelled" | "loop" | "budget"


@dataclass(frozen=True)
class RunErrorEvent:
    code: str  # gRPC status name, e.g. "UNAVAILABLE"
    message: str
    # The error's reason and metadata (agentmesh.error_reasons), for the client's program.
    reason: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)


RunEvent = (
    RunStartedEvent | TextDeltaEvent | ToolCallEvent | ToolResultEvent | StatusEvent | RunFinishedEvent | RunErrorEvent
    | ApprovalRequestEvent | ApprovalResolvedEvent | ReasoningDeltaEvent | TaskUpdateEvent | BackgroundResultEvent
    | TeammateStatusEvent | SubagentEvent
)
