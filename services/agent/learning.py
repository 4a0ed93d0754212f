"""What the agent reads to learn across sessions, bundled so `Agent` takes one argument for it:
the namespace's standing instructions (instructions.py). Each source is optional; a turn offers
what is there."""

from __future__ import annotations

from dataclasses import dataclass

from agentmesh.agent.instructions import InstructionSource


@dataclass(frozen=True)
class LearningSources:
    instructions: InstructionSource | None = None
