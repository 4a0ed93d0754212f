"""Skills in a turn, by progressive disclosure: the system prompt lists each active skill of the
namespace by name and description; `read_skill(name)` loads one's SKILL.md body and copies its
`scripts/` and `references/` files into the session's workspace (under `skills/<name>/`, through
the tools service's `write_file`), where the model runs them with the shell tool — in the
sandbox, like any command. Nothing of a skill ever runs in a service process.

Skills are stored per namespace, with versions, by the memory service (`agentmesh skills add`);
drafts (proposed, not yet approved) are never listed to the model.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Protocol

from agentmesh.agent.capabilities import subagents
from agentmesh.agent.loop.turn import Capability, TurnContext
from agentmesh.agent.types import StatusEvent, ToolCall, ToolOutcome, ToolSpec
from agentmesh.errors import AgentmeshError, NotFound
from agentmesh.logs import get_logger
from agentmesh.toolargs import ArgumentsSchema

log = get_logger("agentmesh.agent.skills")

READ_SKILL = "read_skill"
WORKSPACE_DIR = "skills"
INTRO = ("Skills of this namespace (instructions for recurring tasks; call read_skill with the name to load one "
         "before doing what it covers):")

READ_SKILL_SPEC = ToolSpec(
    name=READ_SKILL,
    description=(
        "Load a skill listed in the system prompt: returns its instructions and copies its scripts and "
        "reference files into the workspace under skills/<name>/, to run with the shell tool."
    ),
    parameters={
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 64, "description": "The skill's name."}},
        "required": ["name"],
        "additionalProperties": False,
    },
)
_SCHEMA = ArgumentsSchema(READ_SKILL, READ_SKILL_SPEC.parameters)


@dataclass(frozen=True)
class SkillSummary:
    name: str
    description: str
    version: int


@dataclass(frozen=True)
class SkillPackage:
    name: str
    version: int
    body: str
    files: tuple[tuple[str, str], ...]  # (path in the skill's folder, content); SKILL.md excluded


class SkillSource(Protocol):
    async def skills(self, namespace: str) -> list[SkillSummary]:
        """The namespace's active skills; raises an AgentmeshError."""
        ...

    async def skill(self, namespace: str, name: str) -> SkillPackage:
        """The active version; raises NotFound or another AgentmeshError."""
        ...


def render(found: list[SkillSummary]) -> str:
    if not found:
        return ""
    return "\n".join([INTRO, *(f"- {s.name}: {s.description}" for s in found)])


class Skills(Capability):
    def __init__(self, ctx: TurnContext, source: SkillSource):
        super().__init__(ctx)
        self._source = source
        self._listed: list[SkillSummary] = []

    def tools(self) -> list[ToolSpec]:
        # Offered once the namespace is known to have skills (the loop asks again before each step).
        return [READ_SKILL_SPEC] if self._listed else []

    async def load(self) -> None:
        try:
            async with asyncio.timeout(self.ctx.settings.recall_timeout_s):
                listed = await self._source.skills(self.ctx.request.namespace)
            # A named agent that lists skills sees those only (docs/agents.md); otherwise every one.
            chosen = self._chosen()
            self._listed = [s for s in listed if chosen is None or s.name in chosen]
        except (AgentmeshError, TimeoutError) as exc:
            reason = exc.message if isinstance(exc, AgentmeshError) else "it took too long"
            log.warning("skills unavailable", error=reason)
            self.ctx.emit(StatusEvent(f"could not list the namespace's skills ({reason}); continuing without them"))

    def _chosen(self) -> frozenset[str] | None:
        agent = self.ctx.request.agent
        return frozenset(agent.skills) if agent is not None and agent.skills else None

    def system_sections(self) -> list[str]:
        section = render(self._listed)
        return [section] if section else []

    async def execute(self, call: ToolCall) -> ToolOutcome:
        try:
            name = _SCHEMA.parse(call.arguments_json)["name"].strip()
        except ValueError as exc:
            return ToolOutcome.error(call, "invalid_arguments", f"error: {exc}")
        agent = self.ctx.request.agent
        if agent is not None and agent.skills and name not in agent.skills:
            known = ", ".join(s.name for s in self._listed) or "none"
            return ToolOutcome.error(call, "not_found", f"error: agent {agent.name!r} does not use skill {name!r}; "
                                     f"its skills: {known}")
        try:
            package = await self._source.skill(self.ctx.request.namespace, name)
        except NotFound:
            known = ", ".join(s.name for s in self._listed) or "none"
            return ToolOutcome.error(call, "not_found", f"error: there is no skill named {name!r}; skills: {known}")
        except AgentmeshError as exc:
            return ToolOutcome.error(call, "unavailable", f"error: could not load skill {name!r}: {exc.message}")
        copied: list[str] = []
        for path, content in package.files:
            target = f"{WORKSPACE_DIR}/{package.name}/{path}"
            written = await self.ctx.agent.tools.execute(
                subagents.workspace_of(self.ctx.request),
                ToolCall(call_id=f"{call.call_id}-copy-{len(copied)}", name="write_file",
                         arguments_json=json.dumps({"path": target, "content": content})),
            )
            if written.is_error:
                return ToolOutcome.error(call, "tool_error",
                                         f"error: skill {name!r} loaded, but copying {path} into the workspace failed: "
                                         f"{written.output}")
            copied.append(target)
        self.ctx.emit(StatusEvent(f"loaded skill {package.name} (version {package.version})"))
        text = f"# Skill: {package.name} (version {package.version})\n\n{package.body}"
        if copied:
            text += ("\n\nIts files are in the workspace (run scripts with the shell tool, e.g. "
                     f"`python3 {copied[0]}` or `bash …`):\n" + "\n".join(f"- {p}" for p in copied))
        return ToolOutcome(call_id=call.call_id, name=call.name, output=text,
                           data={"skill": package.name, "version": package.version, "files": copied})
