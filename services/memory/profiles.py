"""Standing instructions: a namespace's persona (`soul`), user profile (`user`) and project
context (`project`), each a short markdown text the agent puts in every turn's system prompt.

    profiles = Profiles(documents, max_chars=4000)
    await profiles.set("team-a", "soul", "You are terse.")
    profile = await profiles.get("team-a")       # Profile(namespace, soul, user, project, ...)

Each part is one document (ports.DocumentStore), so setting one never races with setting another.
The bound keeps the prompt small: every turn of the namespace pays for these texts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_namespace
from agentmesh.memory.ports import DocumentStore

# The fixed order they appear in, in the API and in the system prompt.
PARTS = ("soul", "user", "project")
KIND = "profile"


@dataclass(frozen=True)
class Profile:
    namespace: str
    soul: str = ""
    user: str = ""
    project: str = ""
    updated_at: float = 0.0
    max_chars: int = 0


class Profiles:
    def __init__(self, documents: DocumentStore, *, max_chars: int, clock: Callable[[], float] = time.time):
        self._documents = documents
        self.max_chars = max_chars
        self._clock = clock

    async def get(self, namespace: str) -> Profile:
        namespace = validate_namespace(namespace)
        texts: dict[str, str] = {}
        updated = 0.0
        for key, body in await self._documents.list_documents(KIND, namespace):
            if key in PARTS:
                texts[key] = body.get("text", "")
                updated = max(updated, float(body.get("updated_at", 0.0)))
        return Profile(namespace=namespace, updated_at=updated, max_chars=self.max_chars, **texts)

    async def set(self, namespace: str, part: str, text: str) -> Profile:
        namespace = validate_namespace(namespace)
        if part not in PARTS:
            raise InvalidArgument(f"there is no profile part {part!r}: use one of {', '.join(PARTS)}")
        text = text.strip()
        if len(text) > self.max_chars:
            raise InvalidArgument(
                f"the {part} text is {len(text)} characters; a profile part may hold at most {self.max_chars} "
                "(every turn of the namespace carries it): shorten it, or raise AGENTMESH_PROFILE_MAX_CHARS"
            )
        if text:
            await self._documents.put_document(KIND, namespace, part, {"text": text, "updated_at": self._clock()})
        else:
            await self._documents.delete_document(KIND, namespace, part)
        return await self.get(namespace)
