"""Sessions and their transcripts: validation, ordering and paging, over the storage port.

Every message gets `seq` = its 1-based position in the session. The session record keeps the
last assigned seq, so a page of the transcript is read by computing point ids (no ordering
query), and messages written past `last_seq` by an append that crashed half-way are simply
invisible until the next append overwrites them.

Seq assignment is serialised per session with an asyncio.Lock inside this process. Several
memory replicas appending to one session at the same moment could race; the gateway runs one
turn per session at a time, which keeps writers to one (docs/memory.md).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
import weakref
from dataclasses import replace
from typing import NamedTuple, Sequence

from agentmesh.errors import InvalidArgument, NotFound
from agentmesh.ids import PARENT_SESSION_LABEL, validate_id, validate_namespace
from agentmesh.images import validate_references
from agentmesh.memory.ports import TranscriptStore, stored_time
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.transcript_records import SessionChanges, SessionRecord, TranscriptMessage
from agentmesh.toolpolicy import validate_permission_mode, validate_policy

ROLES = ("system", "user", "assistant", "tool")
# The agent's bookkeeping, never shown to the model: "usage", a turn's token count for session
# budgets (budget.py); "tasks", the session's task board after a change (task_tools.py).
MESSAGE_KINDS = ("", "summary", "usage", "tasks")
MAX_TITLE_CHARS = 500
MAX_LABELS = 64
MAX_LABEL_CHARS = 256
MAX_TOOL_CALLS = 128
MAX_IMAGES = 64  # a message's image references: the gateway's bound (at most 64), or a step's results'
MAX_PAGE_SESSIONS = 500
MAX_PAGE_MESSAGES = 1000
# The result memory records for a call whose step ended without one (the agent was killed).
NO_RESULT = ("error: no result was recorded for this call — its run stopped before the call finished "
             "(the agent was stopped or crashed); the call may or may not have taken effect")


def new_generation() -> str:
    """A transcript's generation (SessionRecord.generation): random, so that a session deleted
    and created again, or a store that lost its data, never gives one a caller saw before."""
    return secrets.token_hex(8)


class TurnRead(NamedTuple):
    """What a turn's start read of the transcript (read_then_append)."""

    read: list[TranscriptMessage]  # seqs after_seq + 1 on: one page
    next_after: int  # where the rest of the page's transcript starts (0: `read` reaches its end)
    last_seq: int  # the last appended message's
    after_seq: int  # `read` follows it: the caller's known seq when its generation held, else 0
    generation: str  # the transcript's, as read


def _page_size(value: int, default: int, maximum: int, what: str) -> int:
    if value < 0:
        raise InvalidArgument(f"{what} must not be negative, got {value}")
    if value > maximum:
        raise InvalidArgument(f"{what} must be at most {maximum}, got {value}")
    return value or default


class Transcripts:
    def __init__(self, store: TranscriptStore, settings: MemorySettings):
        self._store = store
        self.store = store  # the messages' store, where model_calls.py keeps its records beside them
        self._settings = settings
        # One lock per live session id; entries disappear when no append holds them.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[session_id] = lock
        return lock

    # ---------------------------------------------------------------- sessions

    def _validate_session(self, s: SessionRecord) -> SessionRecord:
        validate_id(s.session_id)
        if len(s.title) > MAX_TITLE_CHARS:
            raise InvalidArgument(f"title is {len(s.title)} characters long; the limit is {MAX_TITLE_CHARS}")
        if len(s.labels) > MAX_LABELS:
            raise InvalidArgument(f"a session carries at most {MAX_LABELS} labels, got {len(s.labels)}")
        for key, value in s.labels.items():
            if not key or len(key) > MAX_LABEL_CHARS or len(value) > MAX_LABEL_CHARS:
                raise InvalidArgument(
                    f"label keys must be 1-{MAX_LABEL_CHARS} characters and values at most {MAX_LABEL_CHARS}"
                )
        return replace(s, namespace=validate_namespace(s.namespace))

    async def put_session(self, session: SessionRecord) -> tuple[SessionRecord, bool]:
        session = self._validate_session(session)
        async with self._lock(session.session_id):
            existing = await self._store.get_session(session.session_id)
            if existing is not None:
                return SessionRecord.from_payload(existing), False
            now = stored_time(time.time())
            created = stored_time(session.created_at) or now
            record = replace(session, created_at=created, updated_at=created, message_count=0,
                             generation=new_generation())
            await self._store.put_session(record.payload())
            return record, True

    async def get_session(self, session_id: str) -> SessionRecord:
        validate_id(session_id)
        payload = await self._store.get_session(session_id)
        if payload is None:
            raise NotFound(f"session {session_id!r} does not exist")
        return SessionRecord.from_payload(payload)

    async def list_sessions(self, page_size: int, page_token: str,
                            namespaces: frozenset[str] | None = None) -> tuple[list[SessionRecord], str]:
        """Newest first. The token is `created_at:skip`: resume at that time, skipping the
        `skip` sessions of the same instant the previous page already returned."""
        size = _page_size(page_size, 50, MAX_PAGE_SESSIONS, "page_size")
        start, skip = None, 0
        if page_token:
            start, skip = _session_page_token(page_token)
        rows = await self._store.list_sessions(size + skip + 1, start, namespaces)
        rows = rows[skip:]
        page, more = rows[:size], len(rows) > size
        sessions = [SessionRecord.from_payload(p) for p in page]
        if not more or not sessions:
            return sessions, ""
        last = sessions[-1].created_at
        # Count every session of this page and earlier pages that shares the boundary instant.
        ties = sum(1 for s in sessions if s.created_at == last)
        if start == last:
            ties += skip
        return sessions, f"{last!r}:{ties}"

    async def set_model(self, session_id: str, model: str) -> SessionRecord:
        """Set the model the session's turns use (the gateway checked the name)."""
        return await self.update_session(session_id, SessionChanges(model=model))

    async def update_session(self, session_id: str, changes: "SessionChanges") -> SessionRecord:
        """Change what `changes` sets (None: leave it); the gateway checked model and tool names."""
        validate_id(session_id)
        if changes.model is not None and len(changes.model) > 200:
            raise InvalidArgument("model is longer than 200 characters")
        if changes.sandbox_template is not None and len(changes.sandbox_template) > 63:
            raise InvalidArgument("sandbox_template is longer than 63 characters", field="sandbox_template")
        if changes.permission_mode is not None:
            validate_permission_mode(changes.permission_mode)
        if changes.tools is not None:
            validate_policy(changes.tools.allow, changes.tools.deny, "tools")
        async with self._lock(session_id):
            payload = await self._store.get_session(session_id)
            if payload is None:
                raise NotFound(f"session {session_id!r} does not exist")
            session = replace(SessionRecord.from_payload(payload), updated_at=time.time())
            if changes.model is not None:
                session.model = changes.model
            if changes.permission_mode is not None:
                session.permission_mode = changes.permission_mode
            if changes.tools is not None:
                session.tools_allow, session.tools_deny = list(changes.tools.allow), list(changes.tools.deny)
            if changes.agent is not None:
                session.agent, session.agent_version = changes.agent
            if changes.sandbox_template is not None:
                session.sandbox_template = changes.sandbox_template
            if changes.record_model_calls is not None:
                session.record_model_calls = changes.record_model_calls
            await self._store.put_session(session.payload())
            return session

    async def clear_transcript(self, session_id: str) -> int:
        """Empty the transcript, keeping the session: its count goes back to 0, so nothing reads
        the old messages and the next append overwrites them (as drop_run does). How many went."""
        validate_id(session_id)
        async with self._lock(session_id):
            payload = await self._store.get_session(session_id)
            if payload is None:
                raise NotFound(f"session {session_id!r} does not exist")
            session = SessionRecord.from_payload(payload)
            cleared, session.message_count, session.updated_at = session.message_count, 0, time.time()
            session.generation = new_generation()
            session.step_calls, session.step_answered, session.step_before = [], [], []
            await self._store.put_session(session.payload())
            return cleared

    async def note_workspace_removed(self, session_id: str, at: float) -> None:
        """Retention removed the session's workspace (nothing to note for a session gone since)."""
        validate_id(session_id)
        async with self._lock(session_id):
            payload = await self._store.get_session(session_id)
            if payload is not None:
                await self._store.put_session({**payload, "workspace_removed_at": stored_time(at)})

    async def delete_session(self, session_id: str) -> bool:
        validate_id(session_id)
        async with self._lock(session_id):
            if await self._store.get_session(session_id) is None:
                return False
            await self._store.delete_session(session_id)
        # Sessions started on this one's behalf (sub-agents) go with it: deleting a conversation
        # must not leave parts of it behind.
        for child in await self._store.child_sessions(session_id, PARENT_SESSION_LABEL):
            await self.delete_session(child)
        return True

    # ---------------------------------------------------------------- messages

    def _validate_message(self, index: int, m: TranscriptMessage) -> None:
        where = f"message {index + 1}"
        if m.role not in ROLES:
            raise InvalidArgument(f"{where}: role must be one of {', '.join(ROLES)}, got {m.role!r}")
        size = len(m.content.encode("utf-8"))
        if size > self._settings.max_content_bytes:
            raise InvalidArgument(
                f"{where}: content is {size} bytes; the limit is {self._settings.max_content_bytes} bytes"
            )
        if len(m.tool_calls) > MAX_TOOL_CALLS:
            raise InvalidArgument(f"{where}: at most {MAX_TOOL_CALLS} tool calls per message, got {len(m.tool_calls)}")
        args = sum(len(c.arguments_json.encode("utf-8")) for c in m.tool_calls)
        if args > self._settings.max_content_bytes:
            raise InvalidArgument(
                f"{where}: tool call arguments total {args} bytes; the limit is {self._settings.max_content_bytes} bytes"
            )
        if m.seq:
            raise InvalidArgument(f"{where}: seq is assigned by the memory service; leave it 0")
        if m.kind not in MESSAGE_KINDS:
            raise InvalidArgument(f"{where}: kind must be empty or one of {', '.join(MESSAGE_KINDS[1:])}, got {m.kind!r}")
        if m.covers_through_seq < 0 or (m.covers_through_seq and m.kind != "summary"):
            raise InvalidArgument(f"{where}: covers_through_seq must be a non-negative seq, set only on a summary")
        # A transcript holds references: the bytes live once, in the session's workspace.
        validate_references([str(i.get("path", "")) for i in m.images], where, max_count=MAX_IMAGES)

    def _validate_append(self, session_id: str, messages: Sequence[TranscriptMessage]) -> None:
        validate_id(session_id)
        if not messages:
            raise InvalidArgument("messages is empty: append at least one message")
        if len(messages) > self._settings.max_messages_per_append:
            raise InvalidArgument(
                f"{len(messages)} messages in one append; the limit is {self._settings.max_messages_per_append}"
            )
        for i, m in enumerate(messages):
            self._validate_message(i, m)

    async def append_messages(self, session_id: str, messages: Sequence[TranscriptMessage]) -> int:
        self._validate_append(session_id, messages)
        async with self._lock(session_id):
            return await self._append(session_id, await self._session_to_append(session_id), messages)

    async def read_then_append(
        self, session_id: str, messages: Sequence[TranscriptMessage], page_size: int,
        known_through_seq: int = 0, known_generation: str = "",
    ) -> TurnRead:
        """A turn's start: the transcript's first page as it stands, then `messages` appended
        after it, under one hold of the session's lock.

        A caller that holds the transcript through `known_through_seq`, read at
        `known_generation`, gets only the messages after it while the transcript's generation
        is still that one: appends alone since, which leave every seq it holds as it was
        (a turn's start then reads and decodes a few messages instead of the whole
        conversation). Any other change gave the transcript a new generation, and the page
        starts at seq 1 again."""
        self._validate_append(session_id, messages)
        size = _page_size(page_size, MAX_PAGE_MESSAGES, MAX_PAGE_MESSAGES, "page_size")
        async with self._lock(session_id):
            session = await self._session_to_append(session_id)
            generation = session.generation
            held = (known_generation and known_generation == generation
                    and 0 < known_through_seq <= session.message_count)
            after = known_through_seq if held else 0
            last_read = min(session.message_count, after + size)
            payloads = await self._store.get_messages(session_id, range(after + 1, last_read + 1)) \
                if last_read > after else []
            read = [TranscriptMessage.from_payload(p) for p in payloads]
            next_after = last_read if last_read < session.message_count else 0
            if not generation:  # a record from before generations were kept: it gets one now
                generation = session.generation = new_generation()
            return TurnRead(read, next_after, await self._append(session_id, session, messages), after, generation)

    async def _session_to_append(self, session_id: str) -> SessionRecord:
        payload = await self._store.get_session(session_id)
        if payload is None:
            raise NotFound(f"session {session_id!r} does not exist; create it with PutSession first")
        return SessionRecord.from_payload(payload)

    async def _append(self, session_id: str, session: SessionRecord, messages: Sequence[TranscriptMessage]) -> int:
        """Number and write `messages` after `session`'s last; the caller holds the session's lock."""
        now = stored_time(time.time())
        messages = _one_result_per_call(session, messages, now)
        if not messages:  # all of it was there already (a retried append that had landed)
            return session.message_count
        numbered = [
            replace(m, seq=session.message_count + i + 1, created_at=stored_time(m.created_at) or now)
            for i, m in enumerate(messages)
        ]
        # The session record, written after the messages, is the commit point: only seqs up
        # to message_count are visible.
        session.message_count = numbered[-1].seq
        session.updated_at = now
        await self._store.append_messages(
            session_id, [m.payload(session_id) for m in numbered], session.payload()
        )
        return session.message_count

    async def drop_run(self, session_id: str, run_id: str) -> int:
        """Remove a run's messages from the end of the transcript (a turn rolled back): the
        session's count goes back to just before the run's user message, so the next append
        overwrites the dropped seqs and nothing reads them meanwhile. The number dropped."""
        validate_id(session_id)
        validate_id(run_id, "run_id")
        async with self._lock(session_id):
            payload = await self._store.get_session(session_id)
            if payload is None:
                raise NotFound(f"session {session_id!r} does not exist")
            session = SessionRecord.from_payload(payload)
            start = await self._run_start(session_id, session.message_count, run_id)
            if start == 0:
                return 0
            dropped = session.message_count - start + 1
            session.message_count = start - 1
            session.generation = new_generation()  # the dropped seqs will be written again
            # The dropped run held the latest step; the one before it was closed by its user message.
            session.step_calls, session.step_answered, session.step_before = [], [], []
            session.updated_at = time.time()
            await self._store.put_session(session.payload())
            return dropped

    async def _run_start(self, session_id: str, last_seq: int, run_id: str) -> int:
        """The first seq of `run_id`'s messages at the end of the transcript (its user message),
        reading back from the end; 0 if the transcript does not end with that run."""
        page = 200
        end, first = last_seq, 0
        while end > 0:
            begin = max(1, end - page + 1)
            for p in reversed(await self._store.get_messages(session_id, range(begin, end + 1))):
                m = TranscriptMessage.from_payload(p)
                if m.run_id == run_id:
                    first = m.seq
                    if m.role == "user":
                        return first
                elif m.run_id:
                    return first  # an earlier turn (or a later one: then nothing of the run is last)
            end = begin - 1
        return first

    async def list_messages(
        self, session_id: str, page_size: int, after_seq: int
    ) -> tuple[list[TranscriptMessage], int]:
        validate_id(session_id)
        size = _page_size(page_size, 200, MAX_PAGE_MESSAGES, "page_size")
        if after_seq < 0:
            raise InvalidArgument(f"after_seq must not be negative, got {after_seq}")
        session = await self.get_session(session_id)
        last = min(session.message_count, after_seq + size)
        if last <= after_seq:
            return [], 0
        payloads = await self._store.get_messages(session_id, range(after_seq + 1, last + 1))
        messages = [TranscriptMessage.from_payload(p) for p in payloads]
        # Transcripts written before appends were idempotent may hold a second result for a call.
        seen: set[str] = set()
        shown: list[TranscriptMessage] = []
        for m in messages:
            if m.role == "tool" and m.tool_call_id:
                if m.tool_call_id in seen:
                    continue
                seen.add(m.tool_call_id)
            shown.append(m)
        messages = shown
        next_after = last if last < session.message_count else 0
        return messages, next_after


def _one_result_per_call(session: SessionRecord, messages: Sequence[TranscriptMessage],
                         now: float) -> list[TranscriptMessage]:
    """`messages` as they go into the transcript: one result per tool call, ever. Appending is
    idempotent by call id. Why it must be: the agent retries an append that failed UNAVAILABLE,
    and one whose answer was lost to a memory restart (kill -9 between the commit and the
    answer) had landed — the retry wrote the step again; a turn stopped while its results' save
    was in flight records them "cancelled", and that save may have landed too. So a result for a
    call already answered is dropped, as is an assistant message whose calls are the latest
    step's own (the same message written again). And when a step ends without a result for
    each of its calls (the agent was killed mid-step), the next user or assistant message closes
    it with an explicit NO_RESULT for each missing one — the stored transcript, as GetTranscript
    shows it, says what happened instead of leaving the call unanswered; a result arriving after
    that (a stopped turn's late "cancelled") is dropped too. `session`'s step record is updated."""
    calls = {c[0]: c for c in session.step_calls}
    answered, before = set(session.step_answered), set(session.step_before)
    kept: list[TranscriptMessage] = []
    for m in messages:
        if m.role == "tool" and m.tool_call_id:
            if m.tool_call_id in answered or m.tool_call_id in before:
                continue
            answered.add(m.tool_call_id)
        elif m.role in ("user", "assistant") and not m.kind:
            ids = [c.call_id for c in m.tool_calls]
            if ids and calls and set(ids) <= set(calls):
                continue
            kept += [TranscriptMessage("tool", NO_RESULT, tool_call_id=call_id, name=name, run_id=run_id, created_at=now)
                     for call_id, name, run_id in calls.values() if call_id not in answered]
            before = set(calls) if calls else before
            calls = {c.call_id: [c.call_id, c.name, m.run_id] for c in m.tool_calls}
            answered = set()
        kept.append(m)
    session.step_before = sorted(before)
    session.step_calls = list(calls.values())
    session.step_answered = [call_id for call_id in calls if call_id in answered]
    return kept


# A page token's skip counts sessions created in the same instant; more than this is no token we issued.
MAX_PAGE_TOKEN_SKIP = 10_000


def _session_page_token(token: str) -> tuple[float, int]:
    """`created_at:skip` as issued by list_sessions: a finite, non-negative time and a small
    count. Anything else (`nan:1`, `1e309:5`, `1:-3`) is refused, never used as a bound."""
    refused = InvalidArgument("page_token is not one this service issued; pass back next_page_token unchanged")
    try:
        raw_start, raw_skip = token.split(":")
        start, skip = float(raw_start), int(raw_skip)
    except ValueError:
        raise refused from None
    if not math.isfinite(start) or start < 0 or not 0 <= skip <= MAX_PAGE_TOKEN_SKIP:
        raise refused
    return start, skip
