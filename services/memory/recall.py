"""Recall over conversations: a namespace's user and assistant messages, searchable like long-term
memory (dense + BM25, fused) with filters by session, time, role and the tools a reply called.

    index = ConversationIndex(store, documents, transcripts, memories, settings)
    index.start()                       # the background indexer, and a catch-up from the watermarks
    index.appended("s-1")               # after an append is acknowledged: O(1), no I/O
    hits = await index.search("team-a", ConversationQuery("what is my dog called"))

Off the turn's critical path: AppendMessages answers once the transcript is written; `appended`
only marks the session, and a background task indexes what was appended since the session's
watermark (a document per session: the last seq indexed). The task waits COALESCE_S after the
first mark before its pass, so that one pass indexes what a turn appends in several calls (its
user message, each step, its answer) and what other sessions appended meanwhile: a pass costs a
watermark read and write and a store write per session, whatever the number of messages. The transcript is the source of
truth, so nothing is lost to a crash after the ack: on start every session whose transcript goes
beyond its watermark is indexed again from there. A search first indexes what is still marked,
so a message is found as soon as its append was acknowledged (read-your-writes), whatever the
indexer's backlog.

The entries live in the long-term store under a namespace of their own, `<namespace>#conversations`
('#' is not allowed in a namespace a client names, so no API reaches it but this module's), one
point per message keyed by (session, seq): indexing the same message twice writes one point.
A hit whose session was deleted, or whose message was cleared, is not answered.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from agentmesh.errors import InvalidArgument
from agentmesh.ids import validate_id, validate_namespace
from agentmesh.logs import get_logger
from agentmesh.memory.memories import DENSE_INPUT_CHARS, MAX_QUERY_BYTES, Memories, date_words, default_dense_weight
from agentmesh.memory.ports import DocumentStore, FusionPlan, PointFilter, Store, point_id, stored_time
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.text import SparseEncoder, Tokenizer
from agentmesh.memory.transcript_records import TranscriptMessage
from agentmesh.memory.transcripts import Transcripts

__all__ = ["ConversationHit", "ConversationIndex", "ConversationQuery", "index_namespace"]

log = get_logger("agentmesh.memory.recall")

WATERMARK = "conversation_watermark"  # document kind: per session, the last seq indexed
ROLES = ("user", "assistant")
DEFAULT_K, MAX_K = 5, 50
READ_BATCH = 256  # messages read and indexed at a time
# Messages read before a session's watermark when indexing past it: enough to hold the context
# window's user and assistant messages between a turn's tool calls and results.
LOOKBACK = 16
RETRY_S = 5.0  # an indexing pass that failed (the embedder is down) is tried again after this
# How long the background task lets marks gather before a pass. No search waits for it (a search
# indexes what is marked first) and the transcript, written before the mark, is what a crash
# recovers from, so this only trades how soon the index is written for how many passes write it.
# A session's pass costs about as much for one message as for several (its reads, its writes, the
# window indexed again), and an agent's turn appends in steps over seconds: five seconds lets one
# pass take most of a turn, where one second took each step apart.
COALESCE_S = 5.0
# Dense vectors of sessions' last indexed messages, kept for the next pass, which indexes them
# again as the new messages' context window (float32: ~2 KB each at 512 dimensions).
RECENT_VECTORS = 2048
# Watermarks this index wrote, kept so that a pass does not read back what it wrote itself (a
# watermark older than the truth, another replica's work, only has messages indexed again).
KNOWN_MARKS = 4096


def index_namespace(namespace: str) -> str:
    return f"{namespace}#conversations"


@dataclass(frozen=True)
class ConversationQuery:
    query: str
    k: int = 0
    session_id: str = ""
    since: float = 0.0
    until: float = 0.0
    role: str = ""
    tool: str = ""


@dataclass(frozen=True)
class ConversationHit:
    session_id: str
    seq: int
    role: str
    text: str
    created_at: float
    score: float
    before: TranscriptMessage | None
    after: TranscriptMessage | None


class ConversationIndex:
    def __init__(self, store: Store, documents: DocumentStore, transcripts: Transcripts, memories: Memories,
                 settings: MemorySettings):
        self._store = store
        self._documents = documents
        self._transcripts = transcripts
        self._memories = memories
        self._settings = settings
        self._sparse = SparseEncoder(Tokenizer())
        self._recent: OrderedDict[str, tuple[str, np.ndarray]] = OrderedDict()  # point id -> (text, dense)
        self._marks: OrderedDict[str, tuple[str, int]] = OrderedDict()  # session -> (namespace, watermark)
        self._date_terms: dict[int, list[str]] = {}  # UTC day -> its date words' terms
        self._marked: dict[str, None] = {}  # sessions with appends not yet indexed, in order
        self._wake = asyncio.Event()
        self._session_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._task: asyncio.Task[None] | None = None
        # Set once the start's catch-up has marked what the watermarks say is missing: a search
        # waits for it, so it finds what was acknowledged before a crash too.
        self._caught_up = asyncio.Event()

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="conversation-index")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def appended(self, session_id: str) -> None:
        """Messages were appended to the session (and acknowledged): index them soon."""
        self._marked[session_id] = None
        self._wake.set()

    async def _run(self) -> None:
        try:
            await self.catch_up()
        except Exception:
            log.exception("conversation index: catching up from the watermarks failed; new appends are still indexed")
        finally:
            self._caught_up.set()
        while True:
            await self._wake.wait()
            await asyncio.sleep(COALESCE_S)
            self._wake.clear()
            try:
                await self.flush()
            except Exception:
                log.exception("conversation index: indexing failed; retrying")
                await asyncio.sleep(RETRY_S)
                self._wake.set()

    async def catch_up(self) -> int:
        """Mark every session whose transcript goes beyond its watermark (what a crash after an
        append's ack left unindexed); returns how many."""
        token, behind = "", 0
        while True:
            sessions, token = await self._transcripts.list_sessions(500, token)
            for s in sessions:
                if s.message_count > await self._watermark(s.namespace, s.session_id):
                    self.appended(s.session_id)
                    behind += 1
            if not token:
                return behind

    async def flush(self) -> None:
        """Index every marked session up to its last message, and wait for the passes already
        running (the background task may have taken a session off the marks a moment ago)."""
        while self._marked:
            session_id = next(iter(self._marked))
            del self._marked[session_id]
            try:
                await self._index_session(session_id)
            except BaseException:
                self._marked[session_id] = None  # left for the next pass
                raise
            # A session's pass runs without a pause (the embedded store's calls are synchronous):
            # turns' calls waiting meanwhile are served between sessions, not after the last.
            await asyncio.sleep(0)
        for lock in list(self._session_locks.values()):
            async with lock:
                pass

    # ------------------------------------------------------------ indexing

    async def _watermark(self, namespace: str, session_id: str) -> int:
        found = await self._documents.get_document(WATERMARK, namespace, session_id)
        return int(found.get("seq", 0)) if found else 0

    async def _last_indexed(self, namespace: str, session_id: str) -> int:
        """The session's watermark, as this index last wrote it when it still knows (no read)."""
        known = self._marks.get(session_id)
        if known is not None and known[0] == namespace:
            self._marks.move_to_end(session_id)
            return known[1]
        return await self._watermark(namespace, session_id)

    async def _set_watermark(self, namespace: str, session_id: str, seq: int) -> None:
        await self._documents.put_document(WATERMARK, namespace, session_id, {"seq": seq})
        self._marks[session_id] = (namespace, seq)
        self._marks.move_to_end(session_id)
        while len(self._marks) > KNOWN_MARKS:
            self._marks.popitem(last=False)

    async def _index_session(self, session_id: str) -> None:
        # One pass per session at a time: the background task and a search's flush may meet here.
        async with self._session_locks.setdefault(session_id, asyncio.Lock()):
            payload = await self._store.get_session(session_id)
            if payload is None:
                return
            namespace = payload.get("namespace") or "default"
            count = int(payload.get("message_count", 0))
            mark = await self._last_indexed(namespace, session_id)
            if count < mark:
                # The transcript was cut (cleared, a run dropped): its seqs are written anew.
                mark = 0
            while mark < count:
                last = min(count, mark + READ_BATCH)
                # The messages before the watermark lend their words to the new ones, and the last
                # of them gain the new ones' words (neighbour context, as memories.py's episodes).
                start = max(1, mark + 1 - LOOKBACK) if self._window() else mark + 1
                messages = await self._store.get_messages(session_id, range(start, last + 1))
                await self._index(namespace, session_id, [TranscriptMessage.from_payload(p) for p in messages], mark)
                await self._set_watermark(namespace, session_id, last)
                mark = last

    def _window(self) -> int:
        return self._settings.context_window if self._settings.context_weight > 0 else 0

    async def _index(
        self, namespace: str, session_id: str, messages: Sequence[TranscriptMessage], mark: int = 0
    ) -> None:
        """Index the messages past `mark`, and re-index the `window` before it whose context they change."""
        wanted = [m for m in messages if m.role in ROLES and m.kind != "summary" and m.content.strip()]
        window = self._window()
        first_new = next((i for i, m in enumerate(wanted) if m.seq > mark), len(wanted))
        todo = range(max(0, first_new - window), len(wanted)) if first_new < len(wanted) else range(0)
        if not todo:
            return
        await self._memories.ready()
        texts = [m.content.strip() for m in wanted]
        where = index_namespace(namespace)
        pids = {i: point_id("conversation", where, session_id, str(wanted[i].seq)) for i in todo}
        # The window before the new messages is indexed again for its context only: its dense
        # vectors are the ones the previous pass embedded, when it still has them.
        dense: dict[int, list[float]] = {}
        for i in todo:
            kept = self._recent.get(pids[i])
            if kept is not None and kept[0] == texts[i]:
                dense[i] = kept[1].tolist()
        missing = [i for i in todo if i not in dense]
        if missing:
            embedded = await self._memories.embedder.embed([texts[i][:DENSE_INPUT_CHARS] for i in missing])
            dense.update(zip(missing, embedded, strict=True))
        # Each message tokenized once, though it is context to the messages around it.
        tokenize = self._sparse.tokenizer.terms
        terms = {j: tokenize(texts[j]) for j in range(max(0, todo.start - window), len(wanted))}
        now = stored_time(time.time())
        rows = []
        for i in todo:
            m, text = wanted[i], texts[i]
            payload: dict[str, Any] = {
                "id": f"{session_id}:{m.seq}", "namespace": where, "text": text, "kind": m.role,
                "metadata": {"session_id": session_id, "seq": m.seq, "tools": sorted({c.name for c in m.tool_calls})},
                "created_at": stored_time(m.created_at), "updated_at": now, "source_session_id": session_id,
            }
            # The messages around it count context_weight ** distance (a question and its answer are
            # a message or two apart); the date as words.
            extra = [
                (terms[j], self._settings.context_weight ** abs(j - i))
                for j in range(max(0, i - window), min(len(wanted), i + window + 1))
                if j != i
            ]
            if self._settings.index_dates:
                extra.append((self._day_terms(m.created_at), 1.0))
            rows.append((pids[i], dense[i], self._sparse.document_terms(terms[i], extra), payload))
        await self._store.upsert_memories(where, rows)
        for i in todo[-window:] if window else ():
            self._recent[pids[i]] = (texts[i], np.asarray(dense[i], dtype=np.float32))
            self._recent.move_to_end(pids[i])
        while len(self._recent) > RECENT_VECTORS:
            self._recent.popitem(last=False)

    def _day_terms(self, created_at: float) -> list[str]:
        day = int(created_at // 86400)  # date_words names the UTC day
        found = self._date_terms.get(day)
        if found is None:
            if len(self._date_terms) >= 64:
                self._date_terms.clear()
            found = self._date_terms[day] = self._sparse.tokenizer.terms(date_words(created_at))
        return found

    # ------------------------------------------------------------ search

    def _filter(self, namespace: str, q: ConversationQuery) -> PointFilter:
        if q.role and q.role not in ROLES:
            raise InvalidArgument(f"role {q.role[:20]!r} is not one the index keeps: use user or assistant", field="role")
        if q.session_id:
            validate_id(q.session_id, "session_id")
        if q.since < 0 or q.until < 0:
            raise InvalidArgument("since and until are unix seconds and cannot be negative", field="since")
        if q.since and q.until and q.since >= q.until:
            raise InvalidArgument("since must be earlier than until", field="since")
        if len(q.tool) > 128:
            raise InvalidArgument("tool names a tool of at most 128 characters", field="tool")
        return PointFilter(
            namespace=index_namespace(namespace),
            kinds=(q.role,) if q.role else ("assistant",) if q.tool else (),
            metadata=(("tools", q.tool),) if q.tool else (),
            created_after=q.since, created_before=q.until, source_session_id=q.session_id,
        )

    async def search(self, namespace: str, q: ConversationQuery) -> list[ConversationHit]:
        namespace = validate_namespace(namespace)
        query = q.query.strip()
        if not query:
            raise InvalidArgument("query is empty: say what to look for", field="query")
        if len(query.encode("utf-8")) > MAX_QUERY_BYTES:
            raise InvalidArgument(f"query is longer than {MAX_QUERY_BYTES} bytes; shorten it", field="query")
        if q.k < 0 or q.k > MAX_K:
            raise InvalidArgument(f"k must be between 1 and {MAX_K}, got {q.k}", field="k")
        pf = self._filter(namespace, q)
        k = q.k or DEFAULT_K
        if self._task is not None:
            await self._caught_up.wait()
        await self.flush()  # what was acknowledged before this search is found by it
        await self._memories.ready()
        dense = (await self._memories.embedder.embed([query[:DENSE_INPUT_CHARS]]))[0]
        s = self._settings
        plan = FusionPlan(fusion=s.fusion, prefetch_limit=max(k * s.prefetch_factor, 20), rrf_k=s.rrf_k,
                          dense_weight=s.dense_weight or default_dense_weight(self._memories.embedder.name),
                          sparse_weight=s.sparse_weight)
        # More than k: hits of deleted sessions or cleared messages are dropped below.
        rows = await self._store.hybrid_search(pf, dense, self._sparse.query(query), k * 2, plan)
        hits: list[ConversationHit] = []
        sessions: dict[str, dict[str, Any] | None] = {}
        for _, score, p in rows:
            session_id, seq = p["source_session_id"], int(p["metadata"]["seq"])
            if session_id not in sessions:
                sessions[session_id] = await self._store.get_session(session_id)
            session = sessions[session_id]
            if session is None or (session.get("namespace") or "default") != namespace:
                continue
            if seq > int(session.get("message_count", 0)):
                continue
            around = {int(m["seq"]): TranscriptMessage.from_payload(m)
                      for m in await self._store.get_messages(session_id, [seq - 1, seq, seq + 1] if seq > 1 else [seq, seq + 1])}
            if seq not in around or around[seq].content.strip() != p["text"]:
                continue  # the seq was written anew since (a dropped run); the index catches up
            hits.append(ConversationHit(session_id, seq, p["kind"], p["text"], float(p["created_at"]), score,
                                        around.get(seq - 1), around.get(seq + 1)))
            if len(hits) == k:
                break
        return hits
