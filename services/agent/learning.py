"""What the agent reads to learn across sessions, bundled so `Agent` takes one argument for it:
the namespace's standing instructions (instructions.py) and skills (skills.py). Each source is optional; a turn offers
what is there."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.agent.instructions import InstructionSource
from agentmesh.agent.skills import SkillSource


@dataclass(frozen=True)
class LearningSources:
    instructions: InstructionSource | None = None
    skills: SkillSource | None = None
