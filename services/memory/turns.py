"""A turn's start in one call: the transcript as it stands, the turn's first message appended
after it, the memories recalled for it, and what the turn's learning capabilities read of the
namespace (standing instructions, skills, promoted tools).

These were six calls from the agent (ListMessages, AppendMessages, Search, GetProfile,
ListSkills, ListPromotedTools), each a gRPC round trip with its serialising, token check and
spans on both sides, at the start of every turn. Recall and the learning reads run beside the
transcript work and never fail the turn: a recall that fails or overruns its time comes back
as a sentence in `recall_error`, a learning part that cannot be read as one in `learning_errors`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from agentmesh.errors import AgentmeshError
from agentmesh.logs import get_logger
from agentmesh.memory.memories import Memories
from agentmesh.memory.memory_records import Hit
from agentmesh.memory.transcript_records import TranscriptMessage
from agentmesh.memory.transcripts import Transcripts

log = get_logger("agentmesh.memory.turns")


@dataclass
class Recall:
    namespace: str
    query: str
    k: int
    timeout_s: float = 0.0  # 0: no bound of its own


# A learning part's read ("profile" | "skills" | "promoted_tools"), tenant check included.
LearningRead = Callable[[], Awaitable[Any]]


@dataclass
class TurnStart:
    transcript: list[TranscriptMessage]
    next_after_seq: int  # 0: `transcript` is all of it
    first_seq: int
    last_seq: int
    recalled: list[Hit] = field(default_factory=list)
    recall_error: str = ""
    learned: dict[str, Any] = field(default_factory=dict)  # part -> what its read returned
    learning_errors: dict[str, str] = field(default_factory=dict)  # part -> why it was not read
    after_seq: int = 0  # `transcript` follows it (the caller holds the rest: Transcripts.read_then_append)
    generation: str = ""  # the transcript's, as read


async def start_turn(
    transcripts: Transcripts,
    memories: Memories,
    session_id: str,
    messages: Sequence[TranscriptMessage],
    page_size: int,
    recall: Recall | None,
    learning: dict[str, LearningRead] | None = None,
    known_through_seq: int = 0,
    known_generation: str = "",
) -> TurnStart:
    recalling = asyncio.create_task(_recall(memories, recall)) if recall is not None and recall.k > 0 else None
    reading = {part: asyncio.create_task(_learn(part, read)) for part, read in (learning or {}).items()}
    try:
        read = await transcripts.read_then_append(session_id, messages, page_size, known_through_seq, known_generation)
    except BaseException:
        for task in [recalling, *reading.values()]:
            if task is not None:
                task.cancel()
        raise
    hits, error = await recalling if recalling is not None else ([], "")
    started = TurnStart(read.read, read.next_after, read.last_seq - len(messages) + 1, read.last_seq, hits, error,
                        after_seq=read.after_seq, generation=read.generation)
    for part, task in reading.items():
        value, why = await task
        if why:
            started.learning_errors[part] = why
        else:
            started.learned[part] = value
    return started


async def _learn(part: str, read: LearningRead) -> tuple[Any, str]:
    try:
        return await read(), ""
    except AgentmeshError as exc:
        return None, exc.message
    except Exception as exc:  # a failed read must not fail the turn's start
        log.exception("learning read failed", part=part)
        return None, f"{type(exc).__name__}: {exc}"


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
