"""Neighbour context: a memory is indexed together with the memories next to it in time.

Memories that share a namespace, a source session and a kind (by default only `episode`: a
saved fact is meant to stand alone) form a stream, e.g. the turns of one conversation. A turn
like "I went yesterday, it was so powerful" is only findable as the answer to "when did Caroline go to the support group" if
the question's words in the turn before it count too. So each memory's search vectors also
carry its neighbours' text at a lower weight (`AGENTMESH_MEMORY_CONTEXT_WEIGHT`); the stored
text and what a search returns stay the memory itself. benches/locomo.py measures the gain.

When a new memory lands between two others, their vectors change too: the writer re-indexes
the neighbours whose context it changed. Forgetting a memory re-indexes its surviving neighbours
the same way, so the forgotten words stop finding them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from agentmesh.memory.ports import MemorySearch, PointFilter

NEIGHBORS = "neighbors"  # payload field: [previous point id, next point id] ('' at an end)
# Payload field: the point ids of every memory whose text is in this one's context (the whole
# window, both sides). A write re-indexes a stored memory when this list changes, and forgetting a
# memory re-indexes those that had it in their window.
WINDOW = "context_ids"


@dataclass
class Pending:
    """A memory about to be written: its point id and payload (the payload gets NEIGHBORS)."""

    pid: str
    payload: dict[str, Any]


@dataclass
class Contextualised:
    pid: str
    payload: dict[str, Any]
    context: list[tuple[str, int]]  # neighbours' texts, each with its distance (1 = next to it)


def _group_key(payload: dict[str, Any], kinds: Sequence[str]) -> tuple[str, str, str] | None:
    session = payload.get("source_session_id") or ""
    if not session or payload.get("kind", "") not in kinds:
        return None
    return payload["namespace"], session, payload.get("kind", "")


async def with_neighbors(
    store: MemorySearch, batch: Sequence[Pending], window: int = 1, kinds: Sequence[str] = ("episode",)
) -> list[Contextualised]:
    """The batch with each member's neighbour texts, plus stored memories whose neighbours changed."""
    out: dict[str, Contextualised] = {}
    groups: dict[tuple[str, str, str], list[tuple[int, Pending]]] = {}
    for order, item in enumerate(batch):
        key = _group_key(item.payload, kinds)
        if key is None or window <= 0:
            item.payload[NEIGHBORS] = ["", ""]
            item.payload[WINDOW] = []
            out[item.pid] = Contextualised(item.pid, item.payload, [])
        else:
            groups.setdefault(key, []).append((order, item))

    for (namespace, session, kind), members in groups.items():
        times = [m.payload["created_at"] for _, m in members]
        # A stored memory up to `window` away from a new one has a new context, and its own window
        # reaches `window` further: so 2 x window on each side are read.
        edge = 2 * window
        before, inside, after = await store.stream_window(
            PointFilter(namespace=namespace, kinds=(kind,), source_session_id=session),
            min(times),
            max(times),
            edge=edge,
        )
        batch_ids = {m.pid for _, m in members}
        stored = [*reversed(before), *inside, *after]
        # Stored memories sort before batch members of the same instant; batch members keep their order.
        rows = [(p["created_at"], 0, i, pid, p, False) for i, (pid, p) in enumerate(stored) if pid not in batch_ids]
        rows += [(m.payload["created_at"], 1, order, m.pid, m.payload, True) for order, m in members]
        rows.sort(key=lambda r: (r[0], r[1], r[2]))
        # A stored memory is re-indexed only when all of its neighbours are in view: the outermost
        # `window` rows are not, unless the store had no more in that direction.
        first_complete = window if len(before) == edge else 0
        last_complete = len(rows) - 1 - (window if len(after) == edge else 0)
        for index, (_, _, _, pid, payload, is_new) in enumerate(rows):
            neighbors = [rows[index - 1][3] if index > 0 else "", rows[index + 1][3] if index + 1 < len(rows) else ""]
            lo, hi = max(0, index - window), min(len(rows), index + 1 + window)
            in_window = [(rows[j], abs(j - index)) for j in range(lo, hi) if j != index]
            ids = [r[3] for r, _ in in_window]
            # A memory stored before WINDOW existed is re-indexed only when its neighbours change.
            unchanged = payload.get(WINDOW, ids) == ids and payload.get(NEIGHBORS) == neighbors
            if not is_new and (unchanged or not first_complete <= index <= last_complete):
                continue
            texts = [(r[4]["text"], distance) for r, distance in in_window]
            out[pid] = Contextualised(pid, {**payload, NEIGHBORS: neighbors, WINDOW: ids}, texts)
    return list(out.values())
