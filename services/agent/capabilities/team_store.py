"""A team's durable state as the agent reaches it (docs/teams.md), and the operations on it that
every teammate and the lead share: teammates, mailboxes, the shared board, protocol requests.

A team is named by its lead's session id; a teammate's session is `<lead>.mate-<name>`. Each
record lives in memory (memory/teams.py) with a version, and every change here is a
compare-and-set retried on a fresh read (`Team.change`), so changes made at once on several
agent replicas all land and none is lost; a task claimed by one teammate is refused to another.

Mail: each recipient's mailbox is one record holding its latest messages, numbered from 1. A
message reaches a model exactly once: the text it is delivered in — a user message injected into
the recipient's transcript, or read_inbox's result — starts each message with `[mail N from X]`,
and that same write is what marks it delivered: a turn (on any replica, after any restart) reads
the highest N of its transcript back as its cursor (`delivered_in`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from agentmesh.agent.types import ChatMessage

__all__ = ["LEAD", "MATE_MARK", "Mail", "Team", "TeamRecord", "TeamServices", "TeamStore", "TeammateRuns", "TeammateStart",
           "delivered_in", "mate_session", "render_mail", "team_of"]

LEAD = "lead"
MATE_MARK = ".mate-"
MAX_KEPT_MAIL = 200
MAX_SWAPS = 50
_MAIL = re.compile(r"^\[mail (\d+) from ", re.M)
NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


@dataclass(frozen=True)
class TeamRecord:
    key: str
    version: int
    body: dict[str, Any]


class TeamStore(Protocol):
    """Memory's team records (adapters/teams.py)."""

    async def swap(self, namespace: str, team: str, kind: str, key: str, body: dict[str, Any],
                   expect: int) -> tuple[bool, TeamRecord | None]: ...
    async def records(self, namespace: str, team: str, kind: str) -> list[TeamRecord]: ...
    async def wait(self, namespace: str, team: str, after: int, timeout_s: float) -> int: ...


@dataclass(frozen=True)
class TeammateStart:
    """What a teammate's run is started with: the lead's model, permission mode and tools as its ceiling."""

    session_id: str
    namespace: str
    message: str
    model: str
    permission_mode: str
    allow: tuple[str, ...]  # empty: what the other layers allow
    deny: tuple[str, ...]
    max_iterations: int
    token_budget: int


class TeammateRuns(Protocol):
    """Starts a teammate as a run of its own (adapters/teams.py: the gateway's CreateRun, so it
    runs on whichever agent replica the gateway picks, with no client attached)."""

    async def start(self, start: TeammateStart) -> str:
        """The run's id; raises an AgentmeshError with the gateway's sentence."""

    async def state(self, run_id: str) -> tuple[str, str]:
        """The run's state (`running`, `failed`, …) and, for a failed one, its error's sentence."""


@dataclass(frozen=True)
class TeamServices:
    """What the composition root (server.py) hands the registry for teams."""

    store: TeamStore
    runs: TeammateRuns


@dataclass(frozen=True)
class Mail:
    seq: int
    sender: str
    text: str
    at: float


def mate_session(team: str, name: str) -> str:
    return f"{team}{MATE_MARK}{name}"


def team_of(session_id: str) -> tuple[str, str] | None:
    """(team, name) of a teammate's session id; None for any other session."""
    team, mark, name = session_id.rpartition(MATE_MARK)
    return (team, name) if mark and team and NAME.match(name) else None


def render_mail(mail: Iterable[Mail]) -> str:
    """Messages as delivered: `[mail N from X] text`, continuation lines indented so no text can
    pass for a delivery mark."""
    return "\n".join(f"[mail {m.seq} from {m.sender}] " + m.text.replace("\n", "\n  ") for m in mail)


def delivered_in(messages: Iterable[ChatMessage]) -> int:
    """The highest mail number a transcript holds (0: none yet)."""
    best = 0
    for m in messages:
        if m.role in ("user", "tool") and "[mail " in m.content:
            best = max([best, *(int(n) for n in _MAIL.findall(m.content))])
    return best


class Team:
    """One team's records, bound to its namespace and lead session."""

    def __init__(self, store: TeamStore, namespace: str, team: str):
        self.store, self.namespace, self.team = store, namespace, team

    async def get(self, kind: str, key: str) -> TeamRecord | None:
        return next((r for r in await self.store.records(self.namespace, self.team, kind) if r.key == key), None)

    async def records(self, kind: str) -> list[TeamRecord]:
        return await self.store.records(self.namespace, self.team, kind)

    async def change(self, kind: str, key: str,
                     apply: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """Read the record, `apply` (which may raise to refuse), write it back if no one wrote
        meanwhile; else again on what they wrote. The body as written."""
        current = await self.get(kind, key)
        for _ in range(MAX_SWAPS):
            body = apply(dict(current.body) if current else None)
            swapped, stored = await self.store.swap(self.namespace, self.team, kind, key, body,
                                                    current.version if current else 0)
            if swapped:
                return body
            current = stored
        raise RuntimeError(f"the team's {kind} record {key!r} kept changing; try again")

    async def wait(self, after: int, timeout_s: float) -> int:
        return await self.store.wait(self.namespace, self.team, after, timeout_s)

    # --- mail ---------------------------------------------------------------------------------

    async def post(self, to: str, sender: str, text: str) -> int:
        """Append to `to`'s mailbox; the message's number there."""
        seq = 0

        def append(box: dict[str, Any] | None) -> dict[str, Any]:
            nonlocal seq
            box = box or {"next": 1, "messages": []}
            seq = int(box["next"])
            messages = [*box["messages"], {"seq": seq, "from": sender, "text": text, "at": time.time()}]
            return {"next": seq + 1, "messages": messages[-MAX_KEPT_MAIL:]}

        await self.change("mail", to, append)
        return seq

    async def mail_after(self, name: str, cursor: int) -> list[Mail]:
        box = await self.get("mail", name)
        if box is None:
            return []
        return [Mail(int(m["seq"]), str(m["from"]), str(m["text"]), float(m.get("at", 0.0)))
                for m in box.body.get("messages", []) if int(m["seq"]) > cursor]

    # --- teammates ----------------------------------------------------------------------------

    async def mates(self) -> list[dict[str, Any]]:
        return [r.body for r in await self.records("mate")]

    async def set_mate(self, name: str, **fields: Any) -> None:
        def update(body: dict[str, Any] | None) -> dict[str, Any]:
            return {**(body or {"name": name}), **fields, "updated_at": time.time()}
        await self.change("mate", name, update)
