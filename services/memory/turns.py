"""A turn's start in one call: the transcript as it stands, the turn's first message appended
after it, and the memories recalled for it.

These were three calls from the agent (ListMessages, AppendMessages, Search), each a gRPC round
trip with its serialising, token check and spans on both sides, at the start of every turn.
Recall runs beside the transcript work and never fails the turn: a recall that fails or
overruns its time comes back as a sentence in `recall_error`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Sequence

from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger
from agentmesh.memory.memories import Hit, Memories
from agentmesh.memory.transcripts import TranscriptMessage, Transcripts

log = get_logger("agentmesh.memory.turns")


@dataclass
class Recall:
    namespace: str
    query: str
    k: int
    timeout_s: float = 0.0  # 0: no bound of its own


@dataclass
class TurnStart:
    transcript: list[TranscriptMessage]
    next_after_seq: int  # 0: `transcript` is all of it
    first_seq: int
    last_seq: int
    recalled: list[Hit] = field(default_factory=list)
    recall_error: str = ""


async def start_turn(
    transcripts: Transcripts,
    memories: Memories,
    session_id: str,
    messages: Sequence[TranscriptMessage],
    page_size: int,
    recall: Recall | None,
) -> TurnStart:
    recalling = asyncio.create_task(_recall(memories, recall)) if recall is not None and recall.k > 0 else None
    try:
        transcript, next_after, last = await transcripts.read_then_append(session_id, messages, page_size)
    except BaseException:
        if recalling is not None:
            recalling.cancel()
        raise
    hits, error = await recalling if recalling is not None else ([], "")
    return TurnStart(transcript, next_after, last - len(messages) + 1, last, hits, error)


async def _recall(memories: Memories, recall: Recall) -> tuple[list[Hit], str]:
    try:
        if recall.timeout_s > 0:
            async with asyncio.timeout(recall.timeout_s):
                return await memories.search(recall.namespace, recall.query, recall.k), ""
        return await memories.search(recall.namespace, recall.query, recall.k), ""
    except TimeoutError:
        return [], f"it took longer than {recall.timeout_s:g}s"
    except AgentmeshError as exc:
        return [], exc.message
    except Exception as exc:  # a failed recall must not fail the turn's start
        log.exception("recall failed")
        return [], f"{type(exc).__name__}: {exc}"
