"""Run modes a turn may ask for (`ChatOptions.mode`): one list and one check for the gateway,
the agent and the scheduler, so a mode refused by one is refused by all, in the same words."""

from __future__ import annotations

from agentmesh.errors import InvalidArgument

__all__ = ["DEEP", "DEFAULT", "RUN_MODES", "validate_mode"]

DEFAULT = "default"
DEEP = "deep"  # planning, reflection, a larger step budget and sub-agents (docs/agent.md)
RUN_MODES = (DEFAULT, DEEP)


def validate_mode(mode: str, field: str = "options.mode") -> str:
    """The mode to run ("" means the default); InvalidArgument naming the valid ones otherwise."""
    if mode in ("", *RUN_MODES):
        return mode or DEFAULT
    shown = mode if len(mode) <= 40 else mode[:40] + "…"
    raise InvalidArgument(f"{field} {shown!r} is not a run mode: use \"default\" (or leave it empty) or \"deep\"",
                          field=field)
