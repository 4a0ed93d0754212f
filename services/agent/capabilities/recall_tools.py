"""`conversation_search`, `block_append` and `block_replace`: tools the agent runs itself against the
memory service, scoped to the session's namespace (the model never chooses it).

- `conversation_search(query, session?, since?, until?, role?)` finds what was said in this
  namespace's earlier conversations (docs/memory.md, "Recall over conversations"): each hit names
  its session and seq and shows the messages around it.
- `block_append(name, text)` / `block_replace(name, old, new)` edit a memory block (`user`,
  `project`, `persona`, …), which every turn's system prompt shows. The edit is recorded with the
  turn's session, its user message's seq and the model; in a namespace whose edits wait for a person it is kept
  as a draft, and the tool says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.types import ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError
from agentmesh.toolargs import ArgumentsSchema

MAX_QUERY_CHARS = 2000
MAX_BLOCK_TEXT_CHARS = 2000
NEIGHBOUR_CHARS = 300  # of each message around a hit: enough to place it, cheap in the context
BLOCK_NAME = {"type": "string", "pattern": r"^[a-z][a-z0-9_-]{0,31}$",
              "description": "The block: user, project, persona, or another lower-case word."}

CONVERSATION_SEARCH = ToolSpec(
    name="conversation_search",
    description=(
        "Search what was said in earlier conversations of this namespace (user and assistant messages, all "
        "sessions). Each hit names its session and message number and shows the messages around it."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for.", "maxLength": MAX_QUERY_CHARS},
            "session": {"type": "string", "maxLength": 128, "description": "Only this session's messages."},
            "since": {"type": "string", "maxLength": 40,
                      "description": "Only messages from this time on: ISO 8601 (2026-11-01 or 2026-11-01T09:00Z)."},
            "until": {"type": "string", "maxLength": 40, "description": "Only messages before this time (ISO 8601)."},
            "role": {"type": "string", "enum": ["user", "assistant"], "description": "Only the user's, or only yours."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    read_only=True,
)

BLOCK_APPEND = ToolSpec(
    name="block_append",
    description=(
        "Add a line to a memory block shown in your system prompt in every later conversation (e.g. the `user` "
        "block for what you learn about the user). Keep it short: each block has a size limit."
    ),
    parameters={
        "type": "object",
        "properties": {
            "name": BLOCK_NAME,
            "text": {"type": "string", "maxLength": MAX_BLOCK_TEXT_CHARS, "description": "The text to add."},
        },
        "required": ["name", "text"],
        "additionalProperties": False,
    },
)

BLOCK_REPLACE = ToolSpec(
    name="block_replace",
    description=(
        "Replace text in a memory block: `old` must be quoted exactly as the block in your system prompt has it "
        "(found once); `new` may be empty to delete it."
    ),
    parameters={
        "type": "object",
        "properties": {
            "name": BLOCK_NAME,
            "old": {"type": "string", "minLength": 1, "maxLength": MAX_BLOCK_TEXT_CHARS},
            "new": {"type": "string", "maxLength": MAX_BLOCK_TEXT_CHARS},
        },
        "required": ["name", "old", "new"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True)
class ConversationFound:
    session_id: str
    seq: int
    role: str
    text: str
    created_at: float
    score: float
    before: str = ""  # "role: text" of the message before, "" at the start
    after: str = ""


@dataclass(frozen=True)
class BlockEdited:
    applied: bool  # False: kept as a draft for a person
    version: int
    chars: int
    max_chars: int
    draft_id: str = ""


@runtime_checkable
class RecallSource(Protocol):
    async def search_conversations(self, namespace: str, query: str, *, session_id: str, since: float,
                                   until: float, role: str) -> list[ConversationFound]:
        """Raises an AgentmeshError."""
        ...

    async def edit_block(self, namespace: str, name: str, change: str, text: str, old: str, *,
                         session_id: str, seq: int, model: str) -> BlockEdited:
        """Raises an AgentmeshError."""
        ...


def _time(value: str, what: str) -> float:
    if not value:
        return 0.0
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what} {value!r} is not an ISO 8601 date or time (e.g. 2026-11-01 or 2026-11-01T09:00Z)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= NEIGHBOUR_CHARS else text[:NEIGHBOUR_CHARS] + "…"


def render_found(found: list[ConversationFound]) -> str:
    if not found:
        return "Nothing in earlier conversations matched."
    lines = []
    for i, f in enumerate(found, 1):
        when = datetime.fromtimestamp(f.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M")
        lines.append(f"{i}. session {f.session_id}, message {f.seq} ({f.role}, {when} UTC, score {f.score:.2f}):")
        if f.before:
            lines.append(f"   before: {_short(f.before)}")
        lines.append(f"   > {f.text}")
        if f.after:
            lines.append(f"   after: {_short(f.after)}")
    return "\n".join(lines)


class RecallTools(Capability):
    """Offers the tools in a turn of an agent whose memory service keeps conversations and blocks."""

    specs = (CONVERSATION_SEARCH, BLOCK_APPEND, BLOCK_REPLACE)
    _schemas: ClassVar[dict[str, ArgumentsSchema]] = {s.name: ArgumentsSchema(s.name, s.parameters) for s in specs}

    def __init__(self, ctx: TurnContext, source: RecallSource):
        super().__init__(ctx)
        self._source = source

    def tools(self) -> list[ToolSpec]:
        return list(self.specs)

    async def execute(self, call: ToolCall) -> ToolOutcome:
        try:
            args = self._schemas[call.name].parse(call.arguments_json)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        try:
            if call.name == "conversation_search":
                return await self._search(call, args)
            return await self._edit(call, args)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {call.name}: {exc}")
        except AgentmeshError as exc:
            return ToolOutcome.error(call, "memory_error", f"error: {call.name} failed: {exc.message}")

    async def _search(self, call: ToolCall, args: dict[str, Any]) -> ToolOutcome:
        query = args["query"].strip()
        if not query:
            raise ValueError("'query' is empty: say what to look for")
        found = await self._source.search_conversations(
            self.ctx.request.namespace, query, session_id=args.get("session", ""),
            since=_time(args.get("since", ""), "since"), until=_time(args.get("until", ""), "until"),
            role=args.get("role", ""))
        return ToolOutcome(call_id=call.call_id, name=call.name, output=render_found(found),
                           data={"hits": [{"session_id": f.session_id, "seq": f.seq, "role": f.role, "text": f.text,
                                           "score": f.score} for f in found]})

    def _turn_seq(self) -> int:
        """The seq of the turn's user message, which asked for the edit: the turn's start appended
        it right after the stored transcript (whose entries may carry no seq of their own)."""
        stored = self.ctx.stored
        return max(max((m.seq for m in stored), default=0), len(stored)) + 1

    async def _edit(self, call: ToolCall, args: dict[str, Any]) -> ToolOutcome:
        name = args["name"]
        if call.name == "block_append":
            change, text, old = "append", args["text"], ""
        else:
            change, text, old = "replace", args["new"], args["old"]
        request = self.ctx.request
        edited = await self._source.edit_block(request.namespace, name, change, text, old,
                                               session_id=request.session_id, seq=self._turn_seq(),
                                               model=self.ctx.model)
        if edited.applied:
            output = (f"Block {name!r} updated (version {edited.version}, {edited.chars} of {edited.max_chars} "
                      "characters); later turns show it in the system prompt.")
        else:
            output = (f"Edit of block {name!r} kept as draft {edited.draft_id}: this namespace's block edits wait "
                      "for a person to approve them, so the block is unchanged for now.")
        return ToolOutcome(call_id=call.call_id, name=call.name, output=output,
                           data={"applied": edited.applied, "version": edited.version, "draft_id": edited.draft_id})
