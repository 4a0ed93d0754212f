"""Time travel: a new session holding the start of another's transcript (Gateway.ForkSession).

The fork keeps messages 1..at_seq — and, when at_seq falls in a step whose tool calls were
answered after it, those answers too, so no call in the fork waits for a result it will never
get. Each message keeps its seq, role, run and time; the fork is written as the agent appends,
so every rule of a transcript is checked again. The source is only read.
"""

from __future__ import annotations

import time
from dataclasses import replace

from agentmesh import error_reasons
from agentmesh.errors import AlreadyExists, InvalidArgument, NotFound
from agentmesh.ids import PARENT_SESSION_LABEL, validate_id
from agentmesh.memory.transcript_records import SessionRecord, TranscriptMessage
from agentmesh.memory.transcripts import MAX_LABELS, MAX_PAGE_MESSAGES, MAX_TITLE_CHARS, Transcripts

__all__ = ["FORK_AT_LABEL", "FORK_OF_LABEL", "check_seq", "fork_session"]

# Which session, and which message of it, a fork started from (labels the console shows).
FORK_OF_LABEL = "agentmesh.fork.of"
FORK_AT_LABEL = "agentmesh.fork.at"


def check_seq(source: SessionRecord, at_seq: int) -> None:
    if at_seq < 1 or at_seq > source.message_count:
        held = f"messages 1 to {source.message_count}" if source.message_count else "no messages"
        raise InvalidArgument(f"at_seq {at_seq} is not a message of session {source.session_id!r}, which holds {held}",
                              field="at_seq", reason=error_reasons.SEQ_OUT_OF_RANGE,
                              metadata={"at_seq": str(at_seq), "message_count": str(source.message_count)})


async def fork_session(transcripts: Transcripts, source: SessionRecord, at_seq: int, new_session_id: str,
                       title: str, created_by: str, batch: int) -> tuple[SessionRecord, int]:
    """Write the fork; returns it and the number of messages it holds."""
    validate_id(new_session_id, "new_session_id")
    check_seq(source, at_seq)
    if len(title) > MAX_TITLE_CHARS:
        raise InvalidArgument(f"title is {len(title)} characters; at most {MAX_TITLE_CHARS}", field="title")
    try:
        await transcripts.get_session(new_session_id)
        raise AlreadyExists(f"session {new_session_id!r} exists already; fork into a new id",
                            metadata={"session_id": new_session_id})
    except NotFound:
        pass
    kept = await _kept_messages(transcripts, source, at_seq)
    now = time.time()
    fork = SessionRecord(
        session_id=new_session_id,
        title=title or f"{source.title or source.session_id} (fork)"[:MAX_TITLE_CHARS],
        created_at=now, updated_at=now,
        labels=_labels(source, at_seq),
        namespace=source.namespace, model=source.model, permission_mode=source.permission_mode,
        tools_allow=list(source.tools_allow), tools_deny=list(source.tools_deny),
        agent=source.agent, agent_version=source.agent_version, created_by=created_by,
    )
    stored, _ = await transcripts.put_session(fork)
    count = 0
    for start in range(0, len(kept), batch):
        count = await transcripts.append_messages(new_session_id, kept[start:start + batch])
    return (replace(stored, message_count=count, updated_at=time.time()) if kept else stored), count


async def _kept_messages(transcripts: Transcripts, source: SessionRecord, at_seq: int) -> list[TranscriptMessage]:
    kept: list[TranscriptMessage] = []
    after = 0
    while True:
        page, next_after = await transcripts.list_messages(source.session_id, MAX_PAGE_MESSAGES, after)
        for m in page:
            if m.seq <= at_seq or (m.role == "tool" and _answers_kept_step(kept, m)):
                kept.append(replace(m, seq=0))
            else:
                return kept
        if not next_after:
            return kept
        after = next_after


def _answers_kept_step(kept: list[TranscriptMessage], m: TranscriptMessage) -> bool:
    """`m` is a result of a call the last kept assistant message made (its step runs past at_seq)."""
    for previous in reversed(kept):
        if previous.role == "assistant":
            return any(call.call_id == m.tool_call_id for call in previous.tool_calls)
        if previous.role != "tool":
            return False
    return False


def _labels(source: SessionRecord, at_seq: int) -> dict[str, str]:
    # A sub-agent's conversation forked is a conversation of its own, not part of its parent's.
    copied = [(k, v) for k, v in source.labels.items() if k not in (PARENT_SESSION_LABEL, FORK_OF_LABEL, FORK_AT_LABEL)]
    return {**dict(copied[:MAX_LABELS - 2]), FORK_OF_LABEL: source.session_id, FORK_AT_LABEL: str(at_seq)}
