"""Builds a Qdrant Edge shard's indexes (HNSW, sparse) in a process of its own.

    python -m agentmesh.memory.edge_indexer SHARD_DIR

`EdgeShard.optimize()` holds the GIL for its whole run (10 s at 20k points, minutes at 100k), so
inside the memory service it would stop every other thread, the gRPC server included. The
service instead copies a shard and runs this on the copy, at low CPU priority, then swaps the
indexed copy in (edge_shards.py). Exit status 0 means the copy is indexed and flushed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time


def _die_with_parent() -> None:
    # Linux: a service killed with -9 takes its index build with it (prctl PR_SET_PDEATHSIG).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m agentmesh.memory.edge_indexer SHARD_DIR", file=sys.stderr)
        return 2
    _die_with_parent()
    os.nice(10)  # the service's searches come first on a small machine
    import qdrant_edge

    started = time.monotonic()
    shard = qdrant_edge.EdgeShard.load(argv[0])
    changed = shard.optimize()
    shard.flush()
    info = shard.info()
    shard.close()
    print(
        f"indexed {info.points_count} points in {info.segments_count} segments "
        f"({'changed' if changed else 'already optimal'}) in {time.monotonic() - started:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
