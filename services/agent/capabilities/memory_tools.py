"""`memory_save` and `memory_search`: tools the agent itself executes against long-term memory,
scoped to the session's namespace (the model never chooses the namespace)."""

from __future__ import annotations

from typing import Any, ClassVar

from agentmesh.agent.loop.ports import LongTermMemory, MemoryHit, NotSupported
from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.types import ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError
from agentmesh.toolargs import ArgumentsSchema

MAX_TEXT_CHARS = 8000
MAX_QUERY_CHARS = 2000
MAX_K = 20
KIND_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"

MEMORY_SAVE = ToolSpec(
    name="memory_save",
    description=(
        "Save a durable memory (a fact, preference, learning or skill) to long-term memory, so that it can be "
        "found in later turns and sessions. Write it as a self-contained sentence."
    ),
    parameters={
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "What to remember, self-contained.", "maxLength": MAX_TEXT_CHARS},
            "kind": {
                "type": "string",
                "pattern": KIND_PATTERN,
                "description": "fact, preference, knowledge, learning, episode or skill (default fact).",
            },
        },
        "required": ["text"],
        "additionalProperties": False,
    },
)

MEMORY_SEARCH = ToolSpec(
    name="memory_search",
    description="Search long-term memory for what was saved before; returns the best matches with scores.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for.", "maxLength": MAX_QUERY_CHARS},
            "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "description": "How many results (default 5)."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    read_only=True,
)

UNAVAILABLE_TEXT = "long-term memory is not available on this memory service yet"


def render_hits(hits: list[MemoryHit]) -> str:
    if not hits:
        return "No memories matched."
    return "\n".join(f"{i}. [{h.kind or 'memory'}] {h.text} (score {h.score:.2f}, id {h.id})" for i, h in enumerate(hits, 1))


class MemoryTools:
    specs = (MEMORY_SAVE, MEMORY_SEARCH)
    names = frozenset(s.name for s in specs)
    _schemas: ClassVar[dict[str, ArgumentsSchema]] = {s.name: ArgumentsSchema(s.name, s.parameters) for s in specs}

    def __init__(self, memory: LongTermMemory):
        self._memory = memory

    async def execute(self, call: ToolCall, namespace: str, session_id: str) -> ToolOutcome:
        try:
            arguments = self._schemas[call.name].parse(call.arguments_json)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        try:
            if call.name == "memory_save":
                return await self._save(call, arguments, namespace, session_id)
            return await self._search(call, arguments, namespace)
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {call.name}: {exc}")
        except NotSupported:
            return ToolOutcome.error(call, "unavailable", f"error: {UNAVAILABLE_TEXT}")
        except AgentmeshError as exc:
            return ToolOutcome.error(call, "memory_error", f"error: {call.name} failed: {exc.message}")

    async def _save(self, call: ToolCall, args: dict[str, Any], namespace: str, session_id: str) -> ToolOutcome:
        text = args["text"].strip()
        if not text:
            raise ValueError("'text' is empty: write the sentence to remember")
        kind = args.get("kind") or "fact"
        hit = await self._memory.remember(namespace, text, kind, session_id)
        return ToolOutcome(
            call_id=call.call_id,
            name=call.name,
            output=f"Saved to long-term memory (id {hit.id}, kind {hit.kind or kind}).",
            data={"id": hit.id, "kind": hit.kind or kind, "namespace": namespace},
        )

    async def _search(self, call: ToolCall, args: dict[str, Any], namespace: str) -> ToolOutcome:
        query = args["query"].strip()
        if not query:
            raise ValueError("'query' is empty: say what to look for")
        k = args.get("k", 5)
        hits = await self._memory.search(namespace, query, k)
        return ToolOutcome(
            call_id=call.call_id,
            name=call.name,
            output=render_hits(hits),
            data={"hits": [{"id": h.id, "text": h.text, "kind": h.kind, "score": h.score} for h in hits]},
        )


class MemoryToolsCapability(Capability):
    """Offers the memory tools in every turn of an agent that has long-term memory."""

    def __init__(self, ctx: TurnContext, tools: MemoryTools):
        super().__init__(ctx)
        self._tools = tools

    def tools(self) -> list[ToolSpec]:
        return list(self._tools.specs)

    async def execute(self, call: ToolCall) -> ToolOutcome:
        return await self._tools.execute(call, self.ctx.request.namespace, self.ctx.request.session_id)
