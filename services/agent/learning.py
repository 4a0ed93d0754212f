"""What the agent reads to learn across sessions, bundled so `Agent` takes one argument for it:
the namespace's standing instructions (instructions.py), skills (skills.py) and promoted tools
(promoted_tools.py). Each source is optional; a turn offers
what is there."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.agent.instructions import InstructionSource
from agentmesh.agent.promoted_tools import PromotedToolStore
from agentmesh.agent.skills import SkillSource


@dataclass(frozen=True)
class LearningSources:
    instructions: InstructionSource | None = None
    skills: SkillSource | None = None
    promoted_tools: PromotedToolStore | None = None
