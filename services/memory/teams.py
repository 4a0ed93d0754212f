"""Teams (docs/teams.md): what a lead session's team keeps, as versioned documents beside the
transcripts — each teammate ("mate", keyed by name), each mailbox ("mail", keyed by the
recipient), the shared task board ("board", one), each protocol request ("protocol", keyed by
its id). The agents running the lead and its teammates change them with a compare-and-set
(`swap`: the document port's `swap_document`), so two teammates on two agent replicas never both
claim a task or both take one mailbox sequence number.

`wait` is how an idle teammate sleeps until its team changes. The team's change number is the
sum of its records' versions — every swap that lands adds one — so it is the same whichever
memory replica answers, as long as they share the store (a Qdrant server): a waiter may ask one
replica and then another. A swap made here wakes this replica's waiters at once; one made through
another replica is seen by the waiters' poll of the store, at first every POLL_FIRST_S, backing
off to every POLL_MAX_S.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.memory.ports import VERSION, DocumentStore

__all__ = ["KINDS", "MAX_BODY_CHARS", "MAX_WAIT_S", "TeamRecords"]

KINDS = ("mate", "mail", "board", "protocol")
MAX_BODY_CHARS = 256 * 1024
MAX_KEY_CHARS = 128
MAX_WAIT_S = 30.0
# A waiter's look at the store for changes made through another memory replica: soon at first
# (a conversation between teammates is quick), then less often while nothing happens.
POLL_FIRST_S = 0.05
POLL_MAX_S = 1.0


class _Team:
    """A team's change number on this replica and who waits on it."""

    def __init__(self) -> None:
        self.change = 0
        self.changed = asyncio.Condition()


class TeamRecords:
    def __init__(self, documents: DocumentStore):
        self._documents = documents
        self._teams: dict[tuple[str, str], _Team] = {}

    def _check(self, namespace: str, team: str, kind: str) -> tuple[str, str]:
        namespace = validate_namespace(namespace or "default")
        validate_id(team)
        if kind not in KINDS:
            raise InvalidArgument(f"kind {kind[:40]!r} is not one of {', '.join(KINDS)}", field="kind")
        return namespace, f"team_{kind}"

    async def swap(self, namespace: str, team: str, kind: str, key: str, body_json: str,
                   expect: int) -> tuple[bool, dict[str, Any] | None]:
        """Write the record if its stored version is `expect`; whether it landed, and the record
        as stored now (with its version under VERSION)."""
        namespace, doc_kind = self._check(namespace, team, kind)
        if not key or len(key) > MAX_KEY_CHARS or "/" in key:
            raise InvalidArgument(f"key must be 1-{MAX_KEY_CHARS} characters without '/'", field="key")
        if len(body_json) > MAX_BODY_CHARS:
            raise InvalidArgument(f"the record is {len(body_json)} characters; at most {MAX_BODY_CHARS}",
                                  field="body_json")
        if expect < 0:
            raise InvalidArgument("version must be 0 or more", field="version")
        try:
            body = json.loads(body_json or "{}")
        except ValueError as exc:
            raise InvalidArgument(f"body_json is not JSON ({exc})", field="body_json") from None
        if not isinstance(body, dict):
            raise InvalidArgument("body_json must be a JSON object", field="body_json")
        body.pop(VERSION, None)
        address = f"{team}/{key}"
        swapped = await self._documents.swap_document(doc_kind, namespace, address, body, expect)
        current = await self._documents.get_document(doc_kind, namespace, address)
        if swapped:
            await self._bump(namespace, team)
        return swapped, current

    async def list(self, namespace: str, team: str, kind: str) -> list[tuple[str, dict[str, Any]]]:
        """The team's records of `kind`, by key; with team "", every team's of the namespace,
        keyed "<team>/<key>" (the agent counts a namespace's running teammates so)."""
        if not team:
            namespace, doc_kind = self._check(namespace, "all", kind)
            return await self._documents.list_documents(doc_kind, namespace)
        namespace, doc_kind = self._check(namespace, team, kind)
        prefix = f"{team}/"
        return [(key[len(prefix):], body) for key, body in await self._documents.list_documents(doc_kind, namespace)
                if key.startswith(prefix)]

    async def wait(self, namespace: str, team: str, after: int, timeout_s: float) -> int:
        """The team's change number once it differs from `after`, or after `timeout_s`."""
        namespace = validate_namespace(namespace or "default")
        validate_id(team)
        state = self._teams.setdefault((namespace, team), _Team())
        deadline = time.monotonic() + min(max(timeout_s, 0.0), MAX_WAIT_S)
        pause = POLL_FIRST_S
        while True:
            seen = state.change

            def changed_here(seen: int = seen) -> bool:
                return state.change != seen

            current = await self.change_of(namespace, team)
            remaining = deadline - time.monotonic()
            if current != after or remaining <= 0:
                return current
            async with state.changed:
                try:
                    await asyncio.wait_for(state.changed.wait_for(changed_here), min(pause, remaining))
                except TimeoutError:
                    pause = min(pause * 2, POLL_MAX_S)

    async def change_of(self, namespace: str, team: str) -> int:
        """The team's change number: the sum of its records' versions, as the store holds them."""
        total = 0
        for kind in KINDS:
            total += sum(int(body.get(VERSION, 0)) for _, body in await self.list(namespace, team, kind))
        return total

    async def _bump(self, namespace: str, team: str) -> None:
        state = self._teams.setdefault((namespace, team), _Team())
        async with state.changed:
            state.change += 1
            state.changed.notify_all()
