"""Skills: SKILL.md packs stored per namespace, with versions, in the memory service.

A skill is a folder: `SKILL.md` (YAML front matter with `name` and `description`, then a
markdown body) and optional files under `scripts/` and `references/`. Every put stores a new
version; the agent lists names and descriptions in its system prompt and loads a body on demand.

    skills = Skills(documents, SkillLimits())
    info = await skills.put("team-a", [SkillFile("SKILL.md", text), ...], source="cli")
    await skills.list("team-a")             # latest active version of each skill
    await skills.get("team-a", "csv-report")

A skill proposed by reflection arrives as a **draft**: stored, not listed to the model, until a
person approves it (`ApproveSkill`), unless the namespace auto-accepts (`SetSkillPolicy`).

Documents (ports.DocumentStore), kind "skill": `<name>` holds the skill's head (latest version, the
active version, status of each version); `<name>@<version>` one version's files. The head is
written last, so a half-written put is never visible.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from agentmesh.errors import InvalidArgument, NotFound
from agentmesh.ids import validate_namespace
from agentmesh.memory.ports import DocumentStore

KIND = "skill"
POLICY_KIND = "skill-policy"
SKILL_FILE = "SKILL.md"
FOLDERS = ("scripts/", "references/")
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.S)


@dataclass(frozen=True)
class SkillLimits:
    max_files: int = 32
    max_bytes: int = 256 * 1024  # all files together
    max_description_chars: int = 300


@dataclass(frozen=True)
class SkillFile:
    path: str
    content: str


@dataclass(frozen=True)
class SkillInfo:
    namespace: str
    name: str
    description: str
    version: int
    status: str  # "active" | "draft"
    paths: tuple[str, ...]
    created_at: float
    source: str = ""


@dataclass(frozen=True)
class Skill:
    info: SkillInfo
    body: str
    files: tuple[SkillFile, ...] = field(default_factory=tuple)


def parse_skill_md(text: str, limits: SkillLimits) -> tuple[str, str, str]:
    """(name, description, body) of a SKILL.md; InvalidArgument with what is wrong."""
    match = _FRONT_MATTER.match(text)
    if not match:
        raise InvalidArgument("SKILL.md must start with YAML front matter between '---' lines, "
                              "holding at least 'name' and 'description'")
    try:
        meta = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"SKILL.md's front matter is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(meta, dict):
        raise InvalidArgument("SKILL.md's front matter must be a mapping of 'name' and 'description'")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidArgument(f"SKILL.md's name {name!r} is not a skill name: use 1-64 characters from a-z, 0-9 "
                              "and '-', starting with a letter or digit")
    if not isinstance(description, str) or not description.strip():
        raise InvalidArgument(f"SKILL.md of {name!r} has no description: say in one sentence when to use the skill")
    description = " ".join(description.split())
    if len(description) > limits.max_description_chars:
        raise InvalidArgument(f"the description of {name!r} is {len(description)} characters; at most "
                              f"{limits.max_description_chars} (every turn's prompt lists it)")
    body = text[match.end():].strip()
    if not body:
        raise InvalidArgument(f"SKILL.md of {name!r} has no body after its front matter: write the instructions")
    return name, description, body


def _check_files(files: list[SkillFile], limits: SkillLimits) -> None:
    if not any(f.path == SKILL_FILE for f in files):
        raise InvalidArgument("a skill needs a SKILL.md file at the top of its folder")
    if len(files) > limits.max_files:
        raise InvalidArgument(f"a skill may have at most {limits.max_files} files; this one has {len(files)}")
    seen: set[str] = set()
    for f in files:
        parts = f.path.split("/")
        if f.path != SKILL_FILE and (not f.path.startswith(FOLDERS) or any(p in ("", ".", "..") for p in parts)):
            raise InvalidArgument(f"{f.path!r} is not a skill file: use SKILL.md, scripts/<file> or references/<file> "
                                  "(relative paths, no '..')")
        if f.path in seen:
            raise InvalidArgument(f"{f.path!r} appears twice")
        seen.add(f.path)
    total = sum(len(f.content.encode()) for f in files)
    if total > limits.max_bytes:
        raise InvalidArgument(f"the skill's files hold {total} bytes; at most {limits.max_bytes}")


class Skills:
    def __init__(self, documents: DocumentStore, limits: SkillLimits, *, clock: Callable[[], float] = time.time):
        self._documents = documents
        self.limits = limits
        self._clock = clock
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def put(self, namespace: str, files: list[SkillFile], *, draft: bool = False, source: str = "") -> SkillInfo:
        namespace = validate_namespace(namespace)
        _check_files(files, self.limits)
        skill_md = next(f for f in files if f.path == SKILL_FILE)
        name, description, body = parse_skill_md(skill_md.content, self.limits)
        if draft and await self.auto_accepts(namespace):
            draft = False
        # Puts of one skill take turns in this process; versions are numbered from the head.
        async with self._locks.setdefault((namespace, name), asyncio.Lock()):
            head = await self._documents.get_document(KIND, namespace, name) or {"versions": {}}
            version = int(head.get("latest", 0)) + 1
            info = SkillInfo(namespace=namespace, name=name, description=description, version=version,
                             status="draft" if draft else "active", paths=tuple(sorted(f.path for f in files)),
                             created_at=self._clock(), source=source)
            await self._documents.put_document(KIND, namespace, f"{name}@{version}", {
                "info": _info_dict(info), "body": body, "files": [{"path": f.path, "content": f.content} for f in files],
            })
            head["latest"] = version
            head["versions"][str(version)] = info.status
            if not draft:
                head["active"] = version
            await self._documents.put_document(KIND, namespace, name, head)
        return info

    async def list(self, namespace: str, *, include_drafts: bool = False) -> list[SkillInfo]:
        namespace = validate_namespace(namespace)
        found: list[SkillInfo] = []
        documents = dict(await self._documents.list_documents(KIND, namespace))
        for key, head in sorted(documents.items()):
            if "@" in key:
                continue
            wanted = [head.get("active")] if head.get("active") else []
            if include_drafts:
                wanted += [int(v) for v, status in head.get("versions", {}).items() if status == "draft"]
            for version in wanted:
                stored = documents.get(f"{key}@{version}")
                if stored is not None:
                    found.append(_info_from(stored["info"], head))
        return found

    async def get(self, namespace: str, name: str, version: int = 0) -> Skill:
        namespace = validate_namespace(namespace)
        head = await self._documents.get_document(KIND, namespace, name)
        if head is None:
            raise NotFound(f"there is no skill {name!r} in namespace {namespace!r}")
        version = version or int(head.get("active") or head.get("latest") or 0)
        stored = await self._documents.get_document(KIND, namespace, f"{name}@{version}")
        if stored is None:
            raise NotFound(f"skill {name!r} has no version {version}")
        return Skill(info=_info_from(stored["info"], head), body=stored["body"],
                     files=tuple(SkillFile(f["path"], f["content"]) for f in stored["files"]))

    async def approve(self, namespace: str, name: str) -> SkillInfo:
        namespace = validate_namespace(namespace)
        async with self._locks.setdefault((namespace, name), asyncio.Lock()):
            head = await self._documents.get_document(KIND, namespace, name)
            drafts = [int(v) for v, s in (head or {}).get("versions", {}).items() if s == "draft"]
            if head is None or not drafts:
                raise NotFound(f"skill {name!r} has no draft to approve in namespace {namespace!r}")
            version = max(drafts)
            head["versions"][str(version)] = "active"
            head["active"] = version
            await self._documents.put_document(KIND, namespace, name, head)
        return (await self.get(namespace, name, version)).info

    async def remove(self, namespace: str, name: str) -> int:
        namespace = validate_namespace(namespace)
        async with self._locks.setdefault((namespace, name), asyncio.Lock()):
            head = await self._documents.get_document(KIND, namespace, name)
            if head is None:
                raise NotFound(f"there is no skill {name!r} in namespace {namespace!r}")
            await self._documents.delete_document(KIND, namespace, name)  # first: nothing lists it any more
            for version in head.get("versions", {}):
                await self._documents.delete_document(KIND, namespace, f"{name}@{version}")
        return len(head.get("versions", {}))

    async def reject(self, namespace: str, name: str) -> int:
        """Drop the skill's waiting drafts; its active version stays (a skill that was only drafts goes)."""
        namespace = validate_namespace(namespace)
        async with self._locks.setdefault((namespace, name), asyncio.Lock()):
            head = await self._documents.get_document(KIND, namespace, name)
            drafts = [v for v, s in (head or {}).get("versions", {}).items() if s == "draft"]
            if head is None or not drafts:
                raise NotFound(f"skill {name!r} has no draft to reject in namespace {namespace!r}")
            for version in drafts:
                del head["versions"][version]
            if head["versions"]:
                # "latest" stays: a rejected draft's number is never given to another version.
                await self._documents.put_document(KIND, namespace, name, head)
            else:
                await self._documents.delete_document(KIND, namespace, name)  # first: nothing lists it any more
            for version in drafts:
                await self._documents.delete_document(KIND, namespace, f"{name}@{version}")
        return len(drafts)

    async def auto_accepts(self, namespace: str) -> bool:
        policy = await self._documents.get_document(POLICY_KIND, validate_namespace(namespace), "policy")
        return bool(policy and policy.get("auto_accept"))

    async def set_policy(self, namespace: str, auto_accept: bool) -> bool:
        await self._documents.put_document(POLICY_KIND, validate_namespace(namespace), "policy", {"auto_accept": auto_accept})
        return auto_accept


def _info_dict(info: SkillInfo) -> dict[str, Any]:
    return {"namespace": info.namespace, "name": info.name, "description": info.description, "version": info.version,
            "paths": list(info.paths), "created_at": info.created_at, "source": info.source}


def _info_from(stored: dict[str, Any], head: dict[str, Any]) -> SkillInfo:
    status = head.get("versions", {}).get(str(stored["version"]), "active")
    return SkillInfo(namespace=stored["namespace"], name=stored["name"], description=stored["description"],
                     version=int(stored["version"]), status=status, paths=tuple(stored["paths"]),
                     created_at=float(stored["created_at"]), source=stored.get("source", ""))
