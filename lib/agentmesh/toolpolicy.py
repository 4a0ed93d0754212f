"""Which tools a turn may use, and which of its calls wait for a person (docs/approvals.md).

Tool policies come in layers — the deployment's, a namespace's, a session's, a turn's — and a
tool is offered only when every layer allows it, so a later layer can narrow what the earlier
ones allow and never widen it. One module for the gateway (which validates and resolves the
layers), the agent (which applies them) and the CLI, so all speak of a policy the same way.

Permission modes say which calls of the offered tools are held for approval: `auto` none (beyond
the deployment's approval list, which always applies), `normal` every tool the catalog does not
mark read-only, `manual` every call.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from agentmesh import error_reasons
from agentmesh.errors import InvalidArgument

__all__ = [
    "AGENT_TOOLS",
    "AUTO",
    "CODE_TOOLS",
    "MANUAL",
    "MAX_ENTRIES",
    "NORMAL",
    "PERMISSION_MODES",
    "ToolPolicy",
    "allowed_by_all",
    "is_pattern",
    "permission_mode_of",
    "runs_code_allowed",
    "session_layers",
    "validate_permission_mode",
    "validate_policy",
]

AUTO, NORMAL, MANUAL = "auto", "normal", "manual"
PERMISSION_MODES = (AUTO, NORMAL, MANUAL)

# The tools the agent runs itself (not the tools service's catalog): a policy may name them too,
# and a self-made (promoted) tool may take none of their names.
AGENT_TOOLS = frozenset({
    "memory_save", "memory_search", "task_create", "task_update", "task_get", "task_list", "delegate_task", "think",
    "read_skill", "promote_skill",
    # Teams (docs/teams.md)
    "spawn_teammate", "list_teammates", "send_message", "broadcast", "read_inbox", "shutdown_request",
    "plan_review", "check_protocol", "submit_plan", "shutdown_response", "task_claim",
})

# The tools that run code the model wrote. A policy that turns off either has said "no code
# here" (each can start the other's interpreter), so everything else that runs model-written
# code — a self-made tool runs its function through `python` — needs both allowed.
CODE_TOOLS = ("shell", "python")

MAX_ENTRIES = 64
_ENTRY = re.compile(r"[A-Za-z0-9_.:/*?\[\]-]{1,128}")
_PATTERN_CHARS = frozenset("*?[")


def is_pattern(entry: str) -> bool:
    return any(c in _PATTERN_CHARS for c in entry)


@dataclass(frozen=True)
class ToolPolicy:
    """One layer: an empty `allow` allows every tool; `deny` wins over `allow`."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def allows(self, name: str) -> bool:
        if any(fnmatch.fnmatchcase(name, entry) for entry in self.deny):
            return False
        return not self.allow or any(fnmatch.fnmatchcase(name, entry) for entry in self.allow)

    @property
    def empty(self) -> bool:
        return not self.allow and not self.deny


def allowed_by_all(policies: Iterable[ToolPolicy], name: str) -> bool:
    return all(policy.allows(name) for policy in policies)


def runs_code_allowed(policies: Iterable[ToolPolicy]) -> bool:
    """Whether every layer allows running code (every tool of CODE_TOOLS)."""
    layers = list(policies)
    return all(allowed_by_all(layers, name) for name in CODE_TOOLS)


def session_layers(deployment: ToolPolicy, namespace: ToolPolicy, session: ToolPolicy | None) -> list[ToolPolicy]:
    """The layers a session's turns start from — the deployment's, the namespace's, the
    session's (None: no session) — the empty ones left out. The gateway (which lists a session's
    tools) and the agent (which resolves a turn) both take them from here."""
    return [layer for layer in (deployment, namespace, session) if layer is not None and not layer.empty]


def permission_mode_of(requested: str, session: str, deployment: str) -> str:
    """A turn's permission mode: its own, else its session's, else the deployment's."""
    return requested or session or deployment


def validate_permission_mode(mode: str, what: str = "permission_mode") -> str:
    """`mode` as given ("" allowed: the next layer's); InvalidArgument naming the modes otherwise."""
    if mode in ("", *PERMISSION_MODES):
        return mode
    shown = mode if len(mode) <= 40 else mode[:40] + "…"
    raise InvalidArgument(f"{what} {shown!r} is not a permission mode: use auto, normal or manual", field=what)


def validate_policy(allow: Sequence[str], deny: Sequence[str], what: str,
                    known: frozenset[str] | None = None) -> ToolPolicy:
    """A policy from its lists, refused with a sentence naming the bad entry. With `known` (the
    catalog's names), a plain name that is no tool is refused too: a misspelt deny would
    otherwise deny nothing. Patterns and MCP tools ("server__tool", whose server may be away)
    are checked for their form only."""
    for field, entries in (("allow", allow), ("deny", deny)):
        if len(entries) > MAX_ENTRIES:
            raise InvalidArgument(f"{what}.{field} lists {len(entries)} entries; at most {MAX_ENTRIES}",
                                  field=f"{what}.{field}")
        for entry in entries:
            if not _ENTRY.fullmatch(entry):
                shown = entry if len(entry) <= 40 else entry[:40] + "…"
                raise InvalidArgument(
                    f"{what}.{field}: {shown!r} is not a tool name or pattern (1-128 characters of letters, digits "
                    "and _ . : / - , with * ? [ ] for patterns)", field=f"{what}.{field}")
            if known is not None and not is_pattern(entry) and "__" not in entry and entry not in known:
                raise InvalidArgument(
                    f"{what}.{field}: there is no tool named {entry!r}; known tools: {', '.join(sorted(known))}",
                    field=f"{what}.{field}", reason=error_reasons.UNKNOWN_TOOL, metadata={"tool": entry})
    return ToolPolicy(tuple(dict.fromkeys(allow)), tuple(dict.fromkeys(deny)))
