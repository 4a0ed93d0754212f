"""`think(thought)`: a scratchpad. The model writes down its reasoning, a plan or a self-check
between steps; nothing runs and nothing changes. The call and its one-line result are recorded
in the transcript like any tool call, so the reasoning can be read back later (`agentmesh
sessions show`), and the event stream shows it as a `tool_call`."""

from __future__ import annotations

from agentmesh.agent.loop.turn import Capability
from agentmesh.agent.types import ToolCall, ToolOutcome, ToolSpec
from agentmesh.toolargs import ArgumentsSchema

THINK = "think"
MAX_THOUGHT_CHARS = 20_000

THINK_SPEC = ToolSpec(
    name=THINK,
    description=(
        "Think out loud: reason about the task, plan the next steps, or check a result before you rely on it. "
        "It has no effects and returns nothing new; use it when a moment of reasoning helps, not for every step."
    ),
    parameters={
        "type": "object",
        "properties": {
            "thought": {"type": "string", "maxLength": MAX_THOUGHT_CHARS, "description": "Your reasoning."},
        },
        "required": ["thought"],
        "additionalProperties": False,
    },
    read_only=True,
)
_SCHEMA = ArgumentsSchema(THINK, THINK_SPEC.parameters)


class ThinkTool(Capability):
    def tools(self) -> list[ToolSpec]:
        return [THINK_SPEC]

    async def execute(self, call: ToolCall) -> ToolOutcome:
        try:
            thought = _SCHEMA.parse(call.arguments_json)["thought"].strip()
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        if not thought:
            return ToolOutcome.error(call, "invalid_arguments", "error: think: 'thought' is empty")
        return ToolOutcome(call_id=call.call_id, name=call.name, output="Thought noted. Carry on.",
                           data={"chars": len(thought)})
