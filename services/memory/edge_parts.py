"""A namespace's memories in bounded parts: sealed Edge shards of at most `part_size` memories,
each indexed once, and one open part that takes the new memories.

Layout of `memories/<namespace>/` (a namespace of one part is the layout every home had before):

    CURRENT, gen-NNNN/, meta.json   part 0: the namespace's first part (edge_shards.IndexedShard)
    part-0001/, part-0002/, ...      the next parts, each CURRENT + gen-NNNN/ of its own

The open part is the last one. Once it holds `part_size` memories, the next new memory opens the
next part, and the one before is sealed: it gets one last index build for what arrived since its
previous build and is never copied again, unless memories it holds are updated in bulk. Why
(docs/memory.md, "Bounded parts"): a build copies the part it indexes and Edge's `load` of the
indexed copy holds the GIL, so with one shard per namespace every build of a 1M namespace copied
2.7 GB, needed that much free disk again, and stopped the service for seconds at the swap; with
parts, a build copies and reloads one part at most.

What the store asks of a namespace goes to its parts:
- a new memory goes to the open part; an update of a stored one goes to the part that holds it
  (a point id lives in exactly one part), so a sealed part takes updates and deletes of its own;
- a search asks each part for its dense and its sparse candidates and fuses them here (`fuse`);
  a namespace of one part is searched exactly as before, by Edge's own fused query;
- a scroll pages through the parts' points merged in id order, so its offset stays a point id;
- counts add up; deletes by filter reach every part; `Forget all` drops the directory.

A crash while the next part is being made leaves a `part-NNNN/` without `CURRENT`: it holds
nothing yet and is removed at the next open.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import qdrant_edge as qe

from agentmesh.logs import get_logger
from agentmesh.memory.edge_shards import CURRENT, IndexedShard
from agentmesh.memory.ports import FusionPlan

log = get_logger("agentmesh.memory.edge")

PART_PREFIX = "part-"

Row = tuple[str, float, Any]  # (point id, score, payload) as one part answers


def _part_dir(root: Path, number: int) -> Path:
    return root if number == 0 else root / f"{PART_PREFIX}{number:04d}"


def fuse(lists: Sequence[list[Row]], plan: FusionPlan, limit: int) -> list[Row]:
    """Qdrant's fusion of ranked lists (each best first), computed here because the lists come
    from several parts. Reciprocal rank fusion as Qdrant scores it — rank r (from 0) of a list
    of weight w adds 1 / ((r + 1) / w + k - 1) — or distribution-based score fusion (each list's
    scores scaled by its mean ± 3 sample standard deviations, then added). Ties keep the order in which
    the points were first seen (dense list first)."""
    scores: dict[str, float] = {}
    payloads: dict[str, Any] = {}
    if plan.fusion == "dbsf":
        for rows in lists:
            if not rows:
                continue
            values = [score for _, score, _ in rows]
            mean = sum(values) / len(values)
            std = (sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)) ** 0.5
            low, high = mean - 3 * std, mean + 3 * std
            for pid, score, payload in rows:
                normalised = 0.5 if high == low else (score - low) / (high - low)
                scores[pid] = scores.get(pid, 0.0) + normalised
                payloads.setdefault(pid, payload)
    else:
        weights = [plan.dense_weight, plan.sparse_weight] if plan.fusion == "weighted" else [1.0, 1.0]
        for rows, weight in zip(lists, weights[: len(lists)], strict=True):
            for rank, (pid, _, payload) in enumerate(rows):
                scores[pid] = scores.get(pid, 0.0) + 1.0 / ((rank + 1) / weight + plan.rrf_k - 1)
                payloads.setdefault(pid, payload)
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])[:limit]
    return [(pid, score, payloads[pid]) for pid, score in ranked]


def best_of(lists: Sequence[list[Row]], limit: int) -> list[Row]:
    """The best `limit` of several parts' lists of one retriever, by score."""
    merged = [row for rows in lists for row in rows]
    merged.sort(key=lambda row: -row[1])
    return merged[:limit]


def in_id_order(lists: Sequence[list[tuple[str, Any]]], limit: int) -> tuple[list[tuple[str, Any]], str]:
    """Merge parts' scroll pages (each in point id order, each up to `limit + 1` long) into the
    namespace's page of `limit` and the next page's offset: the id after it, or '' at the end.
    Edge orders UUID point ids by their 128-bit value."""
    merged = sorted((row for rows in lists for row in rows), key=lambda row: uuid.UUID(row[0]).int)
    if len(merged) > limit:
        return merged[:limit], merged[limit][0]
    return merged, ""


class PartedNamespace:
    """The parts of one namespace (or of the shared layout's one shard set), oldest first."""

    def __init__(self, root: Path, parts: list[IndexedShard], part_size: int,
                 make_part: Callable[[Path], IndexedShard]):
        self.root = root
        self.parts = parts
        self.part_size = part_size
        self._make_part = make_part
        self.write_lock = asyncio.Lock()
        for part in parts[:-1]:
            part.sealed = True

    @classmethod
    def open(cls, root: Path, part_size: int, open_part: Callable[[Path], IndexedShard],
             make_part: Callable[[Path], IndexedShard]) -> "PartedNamespace":
        """`open_part` opens an existing part's directory; `make_part` creates a new one (with the
        payload indexes the store's filters need)."""
        parts = [open_part(root)]
        numbered = sorted(p for p in root.glob(f"{PART_PREFIX}*") if p.is_dir())
        for path in numbered:
            if not (path / CURRENT).exists():  # made by a crash before it held anything
                shutil.rmtree(path, ignore_errors=True)
                continue
            parts.append(open_part(path))
        for number, part in enumerate(parts):
            part.name = root.name if number == 0 else f"{root.name}/{part.root.name}"
        return cls(root, parts, part_size, make_part)

    @property
    def open_part(self) -> IndexedShard:
        return self.parts[-1]

    def maybe_index(self) -> None:
        for part in self.parts:
            part.maybe_index()

    # ------------------------------------------------------------------ writes

    def ensure_room(self) -> IndexedShard:
        """The part new memories go to: the open part, or — once it holds `part_size` — a new
        one, the old open part sealed (and given its last build)."""
        current = self.open_part
        if self.part_size <= 0 or current.shard.info().points_count < self.part_size:
            return current
        number = len(self.parts)
        part = self._make_part(_part_dir(self.root, number))
        part.name = f"{self.root.name}/{part.root.name}"
        current.sealed = True
        self.parts.append(part)
        log.info("memory namespace part sealed", shard=current.name, points=current.shard.info().points_count,
                 next_part=part.name)
        current.maybe_index()
        return part

    def holders(self, ids: Sequence[str]) -> list[tuple[IndexedShard, list[str]]]:
        """Which sealed part holds which of `ids`; the ids no sealed part holds, with the open part."""
        if len(self.parts) == 1:
            return [(self.parts[0], list(ids))]
        rest = list(ids)
        out: list[tuple[IndexedShard, list[str]]] = []
        for part in self.parts[:-1]:
            if not rest:
                break
            found = {str(r.id) for r in part.shard.retrieve(list[Any](rest), False, False)}
            if found:
                out.append((part, [i for i in rest if i in found]))
                rest = [i for i in rest if i not in found]
        if rest:
            out.append((self.open_part, rest))
        return out

    # ------------------------------------------------------------------ reads

    def retrieve(self, ids: Sequence[str]) -> list[Any]:
        found: list[Any] = []
        for part in self.parts:
            found += part.shard.retrieve(list(ids), True, False)
        return found

    def query(self, request_for: Callable[[], qe.QueryRequest]) -> list[list[Row]]:
        """Each part's answer to the same request, as (point id, score, payload) rows; without
        payloads, the part that answered stands in the payload's place (`with_payloads`)."""
        out = []
        for number, part in enumerate(self.parts):
            request = request_for()
            out.append([(str(p.id), float(p.score), p.payload if request.with_payload else number)
                        for p in part.shard.query(request)])
        return out

    def with_payloads(self, rows: list[Row]) -> list[Row]:
        """Rows whose payload is the number of the part that holds them, with their payloads read
        from it: a search converts the payloads of the hits it returns only, not of every
        part's candidates (Edge converts a payload field by field, several µs each)."""
        wanted: dict[int, list[str]] = {}
        for pid, _, number in rows:
            wanted.setdefault(number, []).append(pid)
        payloads: dict[str, Any] = {}
        for number, ids in wanted.items():
            payloads.update((str(r.id), r.payload) for r in self.parts[number].shard.retrieve(list[Any](ids), True, False))
        return [(pid, score, payloads[pid]) for pid, score, _ in rows if pid in payloads]

    def points(self) -> int:
        return sum(part.shard.info().points_count for part in self.parts)

    async def flush(self) -> None:
        for part in self.parts:
            await part.flush()

    async def close(self) -> None:
        # The newest first: a build waiting its turn must not wait for an older part's build.
        for part in reversed(self.parts):
            await part.close()

    async def drop(self) -> None:
        await self.close()
        shutil.rmtree(self.root, ignore_errors=True)
