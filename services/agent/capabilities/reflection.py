"""Reflection: after a session goes idle (the scheduler asks) or on demand (`agentmesh reflect`),
the model reads the session's transcript since its last reflection and extracts

- **knowledge**: facts, commands and endpoints confirmed to work;
- **learnings**: a mistake and its correction;
- **skill candidates**: a reusable procedure, as a SKILL.md body,

as one JSON object. Knowledge and learnings go to long-term memory in the session's namespace
(kinds "knowledge" and "learning"), each with its provenance (session, seq range, model) and a
**dedup key** the model gives it: the memory id derives from (namespace, kind, key), so the same
item extracted twice lands on the same record — unchanged when its text is the same, and
superseding the old text when it differs (a contradicting learning replaces the one it corrects;
the old text is kept in the record's metadata). Skill candidates are stored as drafts, awaiting a
person's approval unless the namespace auto-accepts.

Each session keeps a cursor (memory service, `GetReflectionState`): a finished reflection moves it
to the last entry it read, so the next one reads only what came after, and a second reflection
with nothing new makes no model call and adds nothing. A failed one (model down, malformed
output) is recorded and leaves the cursor, so the stretch is tried again later; it never touches
a turn. `RecalledLearnings` shows a turn's recalled learnings in a `status` event.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from agentmesh.agent.loop.context import clip
from agentmesh.agent.loop.model_call import traced_model_call
from agentmesh.agent.loop.model_choice import NamedModel
from agentmesh.agent.loop.turn import Capability, Stop
from agentmesh.agent.types import ChatMessage, ModelRequest, StatusEvent, Usage
from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger
from agentmesh.models import DEFAULT_MODEL
from agentmesh.telemetry import Telemetry

log = get_logger("agentmesh.agent.reflection")

KNOWLEDGE, LEARNING = "knowledge", "learning"
ENTRY_CHARS = 2000  # of one transcript entry, as the reflecting model reads it
INSTRUCTION = """You review a finished stretch of an agent's conversation to help future sessions.
Extract only what is worth keeping across sessions:
- knowledge: facts, commands, paths or endpoints that were confirmed to work;
- learnings: a mistake the agent made (a failed command, a wrong assumption) and the correction that worked;
- skills: a reusable multi-step procedure worth writing down (rarely; only when clearly reusable).
Give each knowledge and learning item a short, stable "key" naming its subject in lower-case words (the same
subject must get the same key next time, so a newer finding replaces an older one).
Answer with one JSON object and nothing else:
{"knowledge": [{"key": "...", "text": "..."}],
 "learnings": [{"key": "...", "mistake": "...", "correction": "..."}],
 "skills": [{"name": "lower-case-with-dashes", "description": "one sentence", "body": "markdown instructions"}]}
Use empty lists when there is nothing worth keeping."""


class MalformedReflection(ValueError):
    """The model's answer is not the JSON object asked for."""


@dataclass(frozen=True)
class Entry:
    seq: int
    role: str
    text: str


@dataclass(frozen=True)
class Extracted:
    kind: str
    key: str
    text: str


@dataclass
class Outcome:
    status: str = "done"
    seq_from: int = 0
    seq_to: int = 0
    added: int = 0
    superseded: int = 0
    unchanged: int = 0
    skill_drafts: int = 0
    model_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    error: str = ""


class ReflectionBackend(Protocol):
    """What reflection reads and writes in the memory service."""

    async def session_of(self, session_id: str) -> tuple[str, str]:
        """The session's namespace and the model it keeps ("": the default)."""
        ...
    async def last_seq(self, namespace: str, session_id: str) -> int: ...
    async def entries_after(self, session_id: str, after_seq: int) -> list[Entry]: ...
    async def existing_text(self, namespace: str, memory_id: str) -> str | None:
        """The text of the memory with that id, None when there is none."""
    async def remember(self, namespace: str, memory_id: str, kind: str, text: str, metadata: dict[str, Any],
                       session_id: str) -> None: ...
    async def propose_skill(self, namespace: str, skill_md: str, source: str) -> None: ...
    async def record(self, run: dict[str, Any]) -> None: ...


def memory_id(namespace: str, kind: str, key: str) -> str:
    normal = " ".join(re.findall(r"[a-z0-9]+", key.lower()))
    return f"{kind}-" + hashlib.sha256(f"{namespace}\x1f{kind}\x1f{normal}".encode()).hexdigest()[:24]


def transcript_text(entries: list[Entry], budget_chars: int) -> str:
    lines = [f"[{e.seq}] {e.role}: {clip(e.text, ENTRY_CHARS)}" for e in entries]
    text = "\n".join(lines)
    return text if len(text) <= budget_chars else text[-budget_chars:]  # the latest part matters most


def parse(text: str) -> tuple[list[Extracted], list[dict[str, str]]]:
    """(knowledge and learnings, skill candidates) from the model's answer; MalformedReflection."""
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", body, re.S)
    if fenced:
        body = fenced.group(1).strip()
    start, end = body.find("{"), body.rfind("}")
    try:
        found = json.loads(body[start:end + 1]) if start >= 0 else None
    except json.JSONDecodeError as exc:
        raise MalformedReflection(f"the reflection is not valid JSON ({exc.msg})") from None
    if not isinstance(found, dict):
        raise MalformedReflection("the reflection is not a JSON object")
    items: list[Extracted] = []
    for item in found.get("knowledge") or []:
        if isinstance(item, dict) and str(item.get("key", "")).strip() and str(item.get("text", "")).strip():
            items.append(Extracted(KNOWLEDGE, str(item["key"]).strip(), str(item["text"]).strip()))
    for item in found.get("learnings") or []:
        if isinstance(item, dict) and str(item.get("key", "")).strip() and str(item.get("correction", "")).strip():
            mistake = str(item.get("mistake", "")).strip()
            text = f"{mistake} -> {item['correction'].strip()}" if mistake else item["correction"].strip()
            items.append(Extracted(LEARNING, str(item["key"]).strip(), text))
    skills = [s for s in found.get("skills") or []
              if isinstance(s, dict) and all(isinstance(s.get(k), str) and s[k].strip() for k in ("name", "description", "body"))]
    return items, skills


def skill_md(skill: dict[str, str]) -> str:
    description = " ".join(skill["description"].split())
    return f"---\nname: {json.dumps(skill['name'].strip())}\ndescription: {json.dumps(description)}\n---\n{skill['body'].strip()}\n"


class Reflector:
    """`models`: the catalogue's models by name; a session is reflected on by `model` when it
    names one (AGENTMESH_REFLECTION_MODEL), else by the session's own model, else the default."""

    def __init__(self, models: Mapping[str, NamedModel], backend: ReflectionBackend, telemetry: Telemetry, *,
                 model: str = "", transcript_chars: int = 60_000, max_tokens: int = 0):
        self._models = models
        self._backend = backend
        self._telemetry = telemetry
        self._chosen = model
        self._transcript_chars = transcript_chars
        self._max_tokens = max_tokens

    async def reflect(self, session_id: str, trigger: str = "on demand") -> dict[str, Any]:
        """Reflect once and record the run (as a ReflectionRun dict), whatever happens. Raises
        only when the session cannot be found or the run cannot be recorded."""
        namespace, session_model = await self._backend.session_of(session_id)
        named = self._models.get(self._chosen or session_model) or self._models[DEFAULT_MODEL]
        return await self._run(named, namespace, session_id, trigger)

    async def _run(self, named: NamedModel, namespace: str, session_id: str, trigger: str) -> dict[str, Any]:
        started = time.time()
        outcome = Outcome()
        try:
            await self._reflect(namespace, session_id, outcome, named)
        except (AgentmeshError, MalformedReflection) as exc:
            outcome.status = "failed"
            outcome.error = exc.message if isinstance(exc, AgentmeshError) else str(exc)
            log.warning("reflection failed", session_id=session_id, error=outcome.error)
        run = {
            "session_id": session_id, "namespace": namespace, "seq_from": outcome.seq_from, "seq_to": outcome.seq_to,
            "status": outcome.status, "added": outcome.added, "superseded": outcome.superseded,
            "unchanged": outcome.unchanged, "skill_drafts": outcome.skill_drafts, "model": named.model,
            "model_calls": outcome.model_calls, "input_tokens": outcome.usage.input_tokens,
            "output_tokens": outcome.usage.output_tokens, "started_at": started, "finished_at": time.time(),
            "error": outcome.error, "trigger": trigger,
        }
        await self._backend.record(run)
        return run

    async def _reflect(self, namespace: str, session_id: str, outcome: Outcome, named: NamedModel) -> None:
        after = await self._backend.last_seq(namespace, session_id)
        entries = await self._backend.entries_after(session_id, after)
        if not entries:
            outcome.status, outcome.seq_from, outcome.seq_to = "nothing new", after, after
            return
        outcome.seq_from, outcome.seq_to = entries[0].seq, entries[-1].seq
        request = ModelRequest(
            model=named.model, temperature=named.temperature, top_p=named.top_p,
            messages=[ChatMessage(role="system", content=INSTRUCTION),
                      ChatMessage(role="user", content="Transcript:\n" + transcript_text(entries, self._transcript_chars))],
            tools=[], allow_tools=False, max_tokens=named.max_output_tokens or self._max_tokens,
        )
        outcome.model_calls += 1
        reply = await traced_model_call(named.provider, self._telemetry, request, usage=outcome.usage, emit=lambda _: None)
        items, skills = parse(reply.text)
        provenance = {"session_id": session_id, "seq_from": outcome.seq_from, "seq_to": outcome.seq_to,
                      "model": named.model}
        for item in items:
            mid = memory_id(namespace, item.kind, item.key)
            before = await self._backend.existing_text(namespace, mid)
            if before == item.text:
                outcome.unchanged += 1
                continue
            metadata = {**provenance, "dedup_key": item.key}
            if before is not None:
                metadata["supersedes"] = before
                outcome.superseded += 1
            else:
                outcome.added += 1
            await self._backend.remember(namespace, mid, item.kind, item.text, metadata, session_id)
        for skill in skills:
            try:
                await self._backend.propose_skill(namespace, skill_md(skill), f"reflection:{session_id}")
                outcome.skill_drafts += 1
            except AgentmeshError as exc:  # one bad proposal must not lose the rest
                log.warning("a proposed skill was refused", name=skill.get("name"), error=exc.message)


class RecalledLearnings(Capability):
    """A `status` event naming each learning the turn recalled, so a person sees what the agent
    brings from earlier sessions before its first model call."""

    async def before_first_call(self, turn: list[ChatMessage]) -> Stop | None:
        for hit in self.ctx.memories:
            if hit.kind == LEARNING:
                self.ctx.emit(StatusEvent(f"recalled a learning: {clip(hit.text, 300)}"))
        return None
