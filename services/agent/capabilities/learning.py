"""What the agent reads to learn across sessions, bundled so `Agent` takes one argument for it:
the namespace's standing instructions (instructions.py), skills (skills.py) and promoted tools
(promoted_tools.py). Each source is optional; a turn offers what is there.

When the memory service serves the sources (`with_turn_start`), a turn does not call them one by
one: its start (StartTurn, turn_start.py) brings what they would have read, and each
capability's `load` is served from that (`prefetched`). Whatever the start did not bring (an
older memory service) is read from the source as before; reads the capabilities make later in
the turn (a skill's package, a new promoted tool) always go to the source.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from agentmesh.agent.capabilities.instructions import Instructions, InstructionSource
from agentmesh.agent.capabilities.promoted_tools import PromotedToolStore, StoredTool
from agentmesh.agent.capabilities.skills import SkillPackage, SkillSource, SkillSummary
from agentmesh.errors import AgentmeshError

__all__ = ["INSTRUCTIONS", "PROMOTED_TOOLS", "SKILLS", "Brought", "Learned", "LearningSources", "prefetched"]

# The parts a turn's start can bring, by the memory service's names for them.
INSTRUCTIONS, SKILLS, PROMOTED_TOOLS = "profile", "skills", "promoted_tools"


@dataclass(frozen=True)
class LearningSources:
    instructions: InstructionSource | None = None
    skills: SkillSource | None = None
    promoted_tools: PromotedToolStore | None = None
    # The memory service serving these also brings them with a turn's start (StartTurn).
    with_turn_start: bool = False

    def parts(self) -> frozenset[str]:
        """What a turn's start should bring for these sources."""
        if not self.with_turn_start:
            return frozenset()
        wanted = ((INSTRUCTIONS, self.instructions), (SKILLS, self.skills), (PROMOTED_TOOLS, self.promoted_tools))
        return frozenset(part for part, source in wanted if source is not None)

    def for_turn(self) -> "tuple[LearningSources, Brought]":
        """One turn's sources, the first read of each served from what its start brings; the
        start answers through the `Brought` (the loop's `TurnLearning`, ports.py)."""
        brought = Brought(self.parts())
        return prefetched(self, brought), brought


@dataclass(frozen=True)
class Learned:
    """What a turn's start read for the learning capabilities: a value per part read, a sentence
    per part that could not be (the turn goes on without it)."""

    instructions: Instructions | None = None
    skills: list[SkillSummary] | None = None
    promoted_tools: list[StoredTool] | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def failed(cls, reason: str, parts: frozenset[str]) -> "Learned":
        return cls(errors=dict.fromkeys(parts, reason))


class Brought:
    """What a turn's start brought for the learning capabilities, once it has answered; their
    `load` runs beside the start and waits for it here."""

    def __init__(self, parts: frozenset[str] = frozenset()) -> None:
        self._parts = parts  # what the start was asked to bring
        self._answered = asyncio.Event()
        self._learned: Learned | None = None

    def answer(self, learned: Learned | None) -> None:
        """The start's answer (None: it brought nothing, read from the sources); the first counts."""
        if not self._answered.is_set():
            self._learned = learned
            self._answered.set()

    def fail(self, reason: str) -> None:
        """The start failed: every part it was to bring failed with `reason`."""
        self.answer(Learned.failed(reason, self._parts))

    async def part(self, name: str, value_of: str) -> tuple[bool, Any]:
        await self._answered.wait()
        learned = self._learned
        if learned is None:
            return False, None  # the start brought nothing: read it from the source
        if name in learned.errors:
            raise AgentmeshError(learned.errors[name])
        value = getattr(learned, value_of)
        return value is not None, value


class _Instructions:
    def __init__(self, source: InstructionSource, brought: Brought):
        self._source, self._brought = source, brought

    async def instructions(self, namespace: str) -> Instructions:
        found, value = await self._brought.part(INSTRUCTIONS, "instructions")
        return value if found else await self._source.instructions(namespace)


class _Skills:
    def __init__(self, source: SkillSource, brought: Brought):
        self._source, self._brought = source, brought

    async def skills(self, namespace: str) -> list[SkillSummary]:
        found, value = await self._brought.part(SKILLS, "skills")
        return list(value) if found else await self._source.skills(namespace)

    async def skill(self, namespace: str, name: str) -> SkillPackage:
        return await self._source.skill(namespace, name)


class _PromotedTools:
    def __init__(self, source: PromotedToolStore, brought: Brought):
        self._source, self._brought = source, brought

    async def list(self, namespace: str) -> list[StoredTool]:
        found, value = await self._brought.part(PROMOTED_TOOLS, "promoted_tools")
        return list(value) if found else await self._source.list(namespace)

    async def put(self, namespace: str, tool: StoredTool, origin: str) -> StoredTool:
        return await self._source.put(namespace, tool, origin)


def prefetched(sources: LearningSources, brought: Brought) -> LearningSources:
    """One turn's sources: the first read of each served from what its start `brought`."""
    return replace(
        sources,
        instructions=_Instructions(sources.instructions, brought) if sources.instructions is not None else None,
        skills=_Skills(sources.skills, brought) if sources.skills is not None else None,
        promoted_tools=_PromotedTools(sources.promoted_tools, brought) if sources.promoted_tools is not None else None,
    )
