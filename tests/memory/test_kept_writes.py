"""A build's copy is brought up to date from what the writes during the build touched
(edge_shards.KeptWrites): whatever prefix of those writes the copy caught, and however the
catch-up interleaves with further writes, the copy ends equal to the live shard."""

from __future__ import annotations

import random

import qdrant_edge as qe

from agentmesh.memory.edge_shards import KeptWrites
from agentmesh.memory.ports import point_id

DIM = 4


def _config() -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors={"dense": qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine)},
        sparse_vectors={"bm25": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )


def _pid(i: int) -> str:
    return point_id("memory", "ns", f"m{i}")


def _upsert(ids: list[int], kind: str, rng: random.Random) -> tuple[qe.UpdateOperation, list[str]]:
    points = [
        qe.Point(_pid(i), {"dense": [rng.random() + 0.01 for _ in range(DIM)],
                           "bm25": qe.SparseVector([i, 1000 + rng.randrange(5)], [1.0, rng.random()])},
                 {"id": f"m{i}", "kind": kind, "v": rng.random()})
        for i in ids
    ]
    return qe.UpdateOperation.upsert_points(points), [_pid(i) for i in ids]


def _forget_kind(kind: str) -> qe.UpdateOperation:
    # A forget by filter; kinds are many ("k0".."k9"), so each forgets a few points, not half the shard.
    return qe.UpdateOperation.delete_points_by_filter(
        qe.Filter(must=[qe.FieldCondition("kind", match=qe.MatchValue(kind))]))


def _everything(shard: qe.EdgeShard) -> dict:
    records, _ = shard.scroll(qe.ScrollRequest(limit=10_000, with_payload=True, with_vector=True))
    out = {}
    for r in records:
        sparse = r.vector["bm25"]
        out[str(r.id)] = (r.payload, [round(x, 5) for x in r.vector["dense"]], list(sparse.indices),
                          [round(x, 5) for x in sparse.values])
    return out


def test_a_copy_caught_up_from_noted_ids_equals_the_live_shard(tmp_path):
    for seed in range(6):
        rng = random.Random(seed)
        live = qe.EdgeShard.create(str(tmp_path / f"live{seed}"), _config())
        for start in range(0, 60, 20):
            live.update(_upsert(list(range(start, start + 20)), "fact", rng)[0])
        kept = KeptWrites()
        writes: list[tuple[qe.UpdateOperation, list[str] | None]] = []
        copy_at = rng.randrange(0, 40)  # how many of the kept writes the copy caught
        copy = None
        for step in range(80):
            roll = rng.random()
            if roll < 0.6:
                op, touched = _upsert(rng.sample(range(90), rng.randint(1, 8)), f"k{rng.randrange(10)}", rng)
            elif roll < 0.9:
                ids = [_pid(i) for i in rng.sample(range(90), rng.randint(1, 4))]
                op, touched = qe.UpdateOperation.delete_points(ids), ids
            else:
                op, touched = _forget_kind(f"k{rng.randrange(10)}"), None
            live.update(op)
            kept.note(op, touched)
            writes.append((op, touched))
            if step == copy_at:  # a crash-consistent copy: the state before the keeping plus a prefix of it
                copy = qe.EdgeShard.create(str(tmp_path / f"copy{seed}"), _config())
                base = _everything(live)
                copy.update(qe.UpdateOperation.upsert_points(
                    [qe.Point(pid, {"dense": d, "bm25": qe.SparseVector(si, sv)}, p) for pid, (p, d, si, sv) in base.items()]))
            if copy is not None and rng.random() < 0.3:
                kept.catch_up(live, copy, rng.randint(1, 6))  # part of the catch-up, writes go on after it
        assert copy is not None
        kept.catch_up(live, copy, None)
        assert kept.pending() == 0
        assert len(_everything(live)) > 20, "the writes left too little to compare"
        assert _everything(copy) == _everything(live), f"seed {seed}"
        live.close()
        copy.close()


def test_a_point_re_written_after_a_forget_by_filter_survives_the_catch_up(tmp_path):
    """The order that breaks a catch-up applying kept writes after syncing ids: P written, the
    forget of its kind, P written again with that kind — P must stay."""
    rng = random.Random(0)
    live = qe.EdgeShard.create(str(tmp_path / "live"), _config())
    copy = qe.EdgeShard.create(str(tmp_path / "copy"), _config())
    kept = KeptWrites()
    for op, touched in (_upsert([1], "episode", rng), (_forget_kind("episode"), None), _upsert([1], "episode", rng)):
        live.update(op)
        kept.note(op, touched)
    kept.catch_up(live, copy, 1)
    kept.catch_up(live, copy, None)
    assert set(_everything(copy)) == {_pid(1)} == set(_everything(live))
    assert _everything(copy) == _everything(live)
