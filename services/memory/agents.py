"""Named agents: definitions stored per namespace, each change an immutable version (docs/agents.md).

    agents = Agents(store)                       # store: ports.AgentStore
    info = await agents.create("team-a", {"name": "reviewer", "instructions": "...", ...})
    await agents.update("team-a", {...})         # version 2
    await agents.rollback("team-a", "reviewer", 1)  # version 3, a copy of 1
    await agents.get("team-a", "reviewer@1")

Rollback appends: it makes a new version equal to the old one (`rolled_back_from` says which), so
the history only grows and a session's recorded (name, version) always names what it ran.

Three built-ins exist in every namespace — `explore` (read-only tools), `code`, `plan` — as version 0,
never stored; a namespace overrides one by creating an agent of the same name (then it is an
ordinary agent, versions from 1), and deleting that brings the built-in back.

An agent is a dict of its spec's fields (snake_case, as `agents.proto`'s AgentSpec); an answer is
an "info" dict: {namespace, spec, version, current_version, created_at, builtin, rolled_back_from}.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import Any, Callable

from agentmesh.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from agentmesh.ids import validate_namespace
from agentmesh.memory.ports import AgentStore

__all__ = ["BUILTINS", "Agents", "check_spec", "parse_ref"]

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_TOOL = re.compile(r"^[A-Za-z0-9_.:*-]{1,128}$")
PERMISSION_MODES = ("", "auto", "normal", "manual")
MAX_INSTRUCTIONS = 32_000
MAX_DESCRIPTION = 500
MAX_LIST = 64
MAX_STEPS = 1000
LISTS = ("skills", "mcp_servers", "sub_agents", "approvals")

_READ_ONLY = ["read_file", "grep", "glob", "list_dir"]
# The built-ins: what a parent delegates to without defining anything. Their instructions are
# short on purpose: the deployment's base prompt still frames the turn.
BUILTINS: dict[str, dict[str, Any]] = {
    "explore": {
        "name": "explore",
        "description": "Reads and searches the workspace (read-only: read_file, grep, glob, list_dir) and "
                       "reports what it found; it cannot change files or run commands.",
        "instructions": "You explore a workspace to answer a question. Read and search only; report what you "
                        "found, with file paths, briefly.",
        "tools": {"allow": list(_READ_ONLY), "deny": []},
    },
    "code": {
        "name": "code",
        "description": "Writes and changes code in the workspace and runs it to check the change.",
        "instructions": "You write and change code in the workspace. Make the smallest change that does the "
                        "task, run it to check, and report what you changed.",
        "tools": {"allow": [], "deny": []},
    },
    "plan": {
        "name": "plan",
        "description": "Reads the workspace and writes a step-by-step plan for a task, changing nothing.",
        "instructions": "You plan. Read what you need (read-only), then answer with a numbered plan: the steps, "
                        "the files each touches, and how to check the result. Change nothing.",
        "tools": {"allow": list(_READ_ONLY), "deny": []},
    },
}


def _bad(message: str, field: str) -> InvalidArgument:
    return InvalidArgument(message, field=field)


def _strings(spec: dict[str, Any], key: str, field: str, pattern: re.Pattern[str]) -> list[str]:
    values = spec.get(key) or []
    if not isinstance(values, list) or len(values) > MAX_LIST:
        raise _bad(f"{field} must be a list of at most {MAX_LIST} names", field)
    for v in values:
        if not isinstance(v, str) or not pattern.match(v):
            raise _bad(f"{field} holds {v!r}, which is not a name", field)
    return list(values)


def check_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as stored, every field bounded; InvalidArgument naming the field at fault."""
    name = spec.get("name", "")
    if not isinstance(name, str) or not NAME.match(name):
        raise _bad(f"the agent name {name!r} is not valid: use 1-63 characters from a-z, 0-9 and '-', "
                   "starting with a letter or digit", "spec.name")
    description = " ".join(str(spec.get("description") or "").split())
    if len(description) > MAX_DESCRIPTION:
        raise _bad(f"the description is {len(description)} characters; at most {MAX_DESCRIPTION} "
                   "(a parent's model reads it)", "spec.description")
    instructions = str(spec.get("instructions") or "")
    if not instructions.strip():
        raise _bad(f"agent {name!r} has no instructions: say what the agent is for", "spec.instructions")
    if len(instructions) > MAX_INSTRUCTIONS:
        raise _bad(f"the instructions are {len(instructions)} characters; at most {MAX_INSTRUCTIONS}",
                   "spec.instructions")
    out: dict[str, Any] = {"name": name, "description": description, "instructions": instructions,
                           "model": str(spec.get("model") or "")}
    for key, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = spec.get(key)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
            raise _bad(f"{key} must be a number from {low} to {high}", f"spec.{key}")
        out[key] = float(value)
    tools = spec.get("tools") or {}
    out["tools"] = {"allow": _strings(tools, "allow", "spec.tools.allow", _TOOL),
                    "deny": _strings(tools, "deny", "spec.tools.deny", _TOOL)}
    mode = spec.get("permission_mode") or ""
    if mode not in PERMISSION_MODES:
        raise _bad(f"permission_mode {mode!r} is not one of auto, normal, manual", "spec.permission_mode")
    out["permission_mode"] = mode
    for key in LISTS:
        out[key] = _strings(spec, key, f"spec.{key}", _TOOL if key == "approvals" else NAME)
    if name in out["sub_agents"]:
        raise _bad(f"agent {name!r} names itself as a sub-agent", "spec.sub_agents")
    steps, tokens = spec.get("max_steps") or 0, spec.get("token_budget") or 0
    if not isinstance(steps, int) or not 0 <= steps <= MAX_STEPS:
        raise _bad(f"max_steps must be from 0 (the deployment's) to {MAX_STEPS}", "spec.max_steps")
    if not isinstance(tokens, int) or tokens < 0:
        raise _bad("token_budget must be 0 (the deployment's) or more", "spec.token_budget")
    out["max_steps"], out["token_budget"] = steps, tokens
    for key in ("sandbox_template", "isolation", "memory_scope"):
        value = str(spec.get(key) or "")
        if len(value) > 256:
            raise _bad(f"{key} is longer than 256 characters", f"spec.{key}")
        out[key] = value
    if out["isolation"] not in ("", "call", "session"):
        raise _bad(f"sandbox isolation must be call or session (or empty: the template's), got {out['isolation'][:40]!r}",
                   "spec.isolation")
    return out


def parse_ref(ref: str, field: str = "name") -> tuple[str, int]:
    """("NAME", VERSION) of "NAME" (version 0: the current one) or "NAME@VERSION"."""
    name, _, version = ref.partition("@")
    if not NAME.match(name):
        raise _bad(f"{ref!r} does not name an agent: NAME or NAME@VERSION", field)
    if not version:
        return name, 0
    if not version.isdigit() or int(version) < 1:
        raise _bad(f"{ref!r}: the version after '@' must be a number from 1", field)
    return name, int(version)


class Agents:
    def __init__(self, store: AgentStore, *, clock: Callable[[], float] = time.time):
        self._store = store
        self._clock = clock
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def _lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((namespace, name), asyncio.Lock())

    async def _head(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((h for h in await self._store.list_agent_heads(namespace) if h["name"] == name), None)

    async def _write(self, namespace: str, spec: dict[str, Any], head: dict[str, Any] | None,
                     rolled_back_from: int = 0) -> dict[str, Any]:
        version = int(head["latest"]) + 1 if head else 1
        record = {"name": spec["name"], "version": version, "created_at": self._clock(), "spec": spec,
                  "rolled_back_from": rolled_back_from}
        if not await self._store.put_agent_version(namespace, record):
            raise FailedPrecondition(f"version {version} of agent {spec['name']!r} was written meanwhile; retry")
        # The head last: a version is visible once the name points at it.
        await self._store.put_agent_head(namespace, {"name": spec["name"], "latest": version, "current": version})
        return _info(namespace, record, version)

    async def create(self, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
        namespace, spec = validate_namespace(namespace), check_spec(spec)
        async with self._lock(namespace, spec["name"]):
            if await self._head(namespace, spec["name"]) is not None:
                raise AlreadyExists(f"agent {spec['name']!r} exists in namespace {namespace!r}; "
                                    "update it to make a new version")
            return await self._write(namespace, spec, None)

    async def update(self, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
        namespace, spec = validate_namespace(namespace), check_spec(spec)
        async with self._lock(namespace, spec["name"]):
            head = await self._head(namespace, spec["name"])
            if head is None:
                raise NotFound(_missing(namespace, spec["name"]))
            return await self._write(namespace, spec, head)

    async def rollback(self, namespace: str, name: str, version: int) -> dict[str, Any]:
        namespace, (name, _) = validate_namespace(namespace), parse_ref(name)
        if version < 1:
            raise _bad("version must be a number from 1", "version")
        async with self._lock(namespace, name):
            head = await self._head(namespace, name)
            if head is None:
                raise NotFound(_missing(namespace, name))
            old = await self._store.get_agent_version(namespace, name, version)
            if old is None:
                raise NotFound(f"agent {name!r} has no version {version} (versions 1 to {head['latest']})")
            return await self._write(namespace, old["spec"], head, rolled_back_from=version)

    async def get(self, namespace: str, ref: str) -> dict[str, Any]:
        namespace = validate_namespace(namespace)
        name, version = parse_ref(ref)
        head = await self._head(namespace, name)
        if head is None:
            if name in BUILTINS and version == 0:
                return _builtin(namespace, name)
            raise NotFound(_missing(namespace, name))
        record = await self._store.get_agent_version(namespace, name, version or int(head["current"]))
        if record is None:
            raise NotFound(f"agent {name!r} has no version {version} (versions 1 to {head['latest']})")
        return _info(namespace, record, int(head["current"]))

    async def list_all(self, namespace: str) -> list[dict[str, Any]]:
        namespace = validate_namespace(namespace)
        heads = {h["name"]: h for h in await self._store.list_agent_heads(namespace)}
        found = [_builtin(namespace, n) for n in BUILTINS if n not in heads]
        for name, head in heads.items():
            record = await self._store.get_agent_version(namespace, name, int(head["current"]))
            if record is not None:
                found.append(_info(namespace, record, int(head["current"])))
        return sorted(found, key=lambda i: i["spec"]["name"])

    async def versions(self, namespace: str, name: str) -> list[dict[str, Any]]:
        namespace, (name, _) = validate_namespace(namespace), parse_ref(name)
        head = await self._head(namespace, name)
        if head is None:
            if name in BUILTINS:
                return [_builtin(namespace, name)]
            raise NotFound(_missing(namespace, name))
        records = await self._store.list_agent_versions(namespace, name)
        return [_info(namespace, r, int(head["current"])) for r in sorted(records, key=lambda r: r["version"])]

    async def delete(self, namespace: str, name: str) -> int:
        namespace, (name, _) = validate_namespace(namespace), parse_ref(name)
        async with self._lock(namespace, name):
            if await self._head(namespace, name) is None:
                if name in BUILTINS:
                    raise FailedPrecondition(f"{name!r} is a built-in agent and cannot be deleted; "
                                             "define an agent of that name to override it")
                raise NotFound(_missing(namespace, name))
            return await self._store.delete_agent(namespace, name)


def _missing(namespace: str, name: str) -> str:
    return f"no agent {name!r} in namespace {namespace!r} (ListAgents shows them)"


def _info(namespace: str, record: dict[str, Any], current: int) -> dict[str, Any]:
    return {"namespace": namespace, "spec": record["spec"], "version": int(record["version"]),
            "current_version": current, "created_at": float(record.get("created_at", 0.0)), "builtin": False,
            "rolled_back_from": int(record.get("rolled_back_from", 0))}


def _builtin(namespace: str, name: str) -> dict[str, Any]:
    return {"namespace": namespace, "spec": check_spec(BUILTINS[name]), "version": 0, "current_version": 0,
            "created_at": 0.0, "builtin": True, "rolled_back_from": 0}
