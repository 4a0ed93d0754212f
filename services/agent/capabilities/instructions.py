"""Standing instructions in the system prompt: the namespace's `soul`, `user` and `project`
texts (set with `agentmesh profile set`, stored by the memory service), read once per turn and
placed right after the base prompt, in that fixed order, under one heading each:

    <base prompt>

    Standing instructions for this namespace (...):
    ## Persona
    <soul>
    ## About the user
    <user>
    ## Project context
    <project>

    Memory blocks (...):         (the ones the agent keeps itself: recall_tools.py)
    ## user
    <the user block>

    Today is ...

Deep mode uses them on every step like any turn. A sub-agent gets a compact version: each part
cut to its first `SUBAGENT_CHARS` characters, since it works on one narrow task and its prompt
is paid again for every delegation. A turn whose instructions cannot be read goes on without
them, with a status event saying so.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.types import StatusEvent
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger

log = get_logger("agentmesh.agent.instructions")

SUBAGENT_CHARS = 600
HEADINGS = (("soul", "Persona"), ("user", "About the user"), ("project", "Project context"))
BLOCKS_INTRO = ("Memory blocks (what you keep current about this namespace with block_append and "
                "block_replace; every later conversation shows them):")
INTRO = ("Standing instructions for this namespace (set by its users; follow them unless the user asks "
         "otherwise in this conversation):")


@dataclass(frozen=True)
class Instructions:
    soul: str = ""
    user: str = ""
    project: str = ""
    # The namespace's memory blocks, (name, text) in the memory service's fixed order: the
    # agent keeps them with block_append / block_replace (recall_tools.py).
    blocks: tuple[tuple[str, str], ...] = ()


class InstructionSource(Protocol):
    async def instructions(self, namespace: str) -> Instructions:
        """The namespace's texts ('' for a part not set); raises an AgentmeshError."""
        ...


def _compact(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit].rstrip() + " […]"


def render(found: Instructions, *, compact: bool = False) -> str:
    """The system-prompt section, or '' when no part is set: the standing instructions, then the
    memory blocks."""
    parts = []
    for field, heading in HEADINGS:
        text = getattr(found, field).strip()
        if text:
            parts.append(f"## {heading}\n{_compact(text, SUBAGENT_CHARS) if compact else text}")
    section = "\n".join([INTRO, *parts]) if parts else ""
    blocks = [f"## {name}\n{_compact(text, SUBAGENT_CHARS) if compact else text.strip()}"
              for name, text in found.blocks if text.strip()]
    if blocks:
        section = "\n\n".join(filter(None, [section, "\n".join([BLOCKS_INTRO, *blocks])]))
    return section


class StandingInstructions(Capability):
    def __init__(self, ctx: TurnContext, source: InstructionSource):
        super().__init__(ctx)
        self._source = source
        self._section = ""

    async def load(self) -> None:
        request = self.ctx.request
        try:
            async with asyncio.timeout(self.ctx.settings.recall_timeout_s):
                found = await self._source.instructions(request.namespace)
        except (AgentmeshError, TimeoutError) as exc:
            reason = exc.message if isinstance(exc, AgentmeshError) else "it took too long"
            log.warning("standing instructions unavailable", error=reason)
            self.ctx.emit(StatusEvent(f"could not read the standing instructions ({reason}); continuing without them"))
            return
        self._section = render(found, compact=request.subagent is not None)

    def system_sections(self) -> list[str]:
        return [self._section] if self._section else []
