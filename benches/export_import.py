"""A namespace of 10k memories and 1k sessions through `agentmesh export` and `agentmesh import`:
time of each, the file's size, and that everything arrived.

    python -m benches.export_import [--memories 10000] [--sessions 1000] [--messages 4]

The services run in this process on free ports (memory, tools, gateway, scheduler; the default
embedded store and hashing embedder); the commands run as a user runs them, in child processes.
The namespace is filled through the RPCs (memories imported in batches of 256, sessions
restored with `--messages` messages each), exported to a file, and imported into a second,
fresh home — twice in one run: with the memories' vectors (the default, nothing embedded again)
and with `--text` (the baseline: the import embeds every text), each into a fresh home. Numbers go
in docs/memory.md#export-and-import with the machine, its load and the date.

Measured 2026-11-28 07:24 UTC, 2-core Intel Xeon VM shared with other builds (load 8-11):

| memories | sessions | export | import | file |
|---|---|---|---|---|
| 10000 | 1000 | 4.8 s | 18.5 s | 3.5 MB |

Measured 2026-11-28 10:19 UTC, the same VM heavily loaded (load 18-22), both modes in one run:

| memories as | memories | sessions | export | import | file |
|---|---|---|---|---|---|
| vectors | 10000 | 1000 | 10.6 s | 26.6 s | 31.0 MB |
| text | 10000 | 1000 | 9.1 s | 26.0 s | 3.5 MB |
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.v1 import common_pb2, sessions_pb2
from tests.support.stack import Stack

SERVICES = ("memory", "tools", "gateway", "scheduler")
NAMESPACE = "bench"


async def _cli(stack: Stack, *args: str, stdout=None) -> tuple[float, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update({f"AGENTMESH_{n.upper()}_ADDR": a for n, a in stack.addresses.items()})
    env["AGENTMESH_HOME"] = stack.env["AGENTMESH_HOME"]
    started = time.perf_counter()
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentmesh.cli.main", *args], env=env,
                                   text=True, stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE)
    if done.returncode:
        raise SystemExit(f"agentmesh {' '.join(args)} failed: {done.stderr}")
    return time.perf_counter() - started, done


async def _fill(stack: Stack, memories: int, sessions: int, messages: int) -> float:
    started = time.perf_counter()
    memory = memory_service_pb2_grpc.MemoryStub(stack.user_channel("memory"))  # as `agentmesh import` calls it
    for first in range(0, memories, 256):
        batch = [memory_service_pb2.RememberRequest(namespace=NAMESPACE, text=f"memory {i}: the crew logged item {i} "
                                            f"at station {i % 97} with note {i * 7919 % 10007}", kind="fact")
                 for i in range(first, min(first + 256, memories))]
        await memory.Import(memory_service_pb2.ImportRequest(namespace=NAMESPACE, memories=batch))
    for s in range(sessions):
        transcript = [common_pb2.Message(role="user" if m % 2 == 0 else "assistant",
                                         content=f"session {s} message {m}: " + "words " * 20)
                      for m in range(messages)]
        await memory.RestoreSession(memory_service_pb2.RestoreSessionRequest(
            session=sessions_pb2.Session(session_id=f"bench-{s}", namespace=NAMESPACE), messages=transcript))
    return time.perf_counter() - started


async def _count(stack: Stack, namespace: str) -> tuple[int, int]:
    memory, gateway = stack.memory_stub(), stack.gateway_stub()
    memories, token = 0, ""
    while True:
        page = await memory.ListMemories(memory_service_pb2.ListMemoriesRequest(namespace=namespace, page_size=1000,
                                                                        page_token=token))
        memories += len(page.memories)
        token = page.next_page_token
        if not token:
            break
    sessions, token = 0, ""
    while True:
        listed = await gateway.ListSessions(sessions_pb2.ListSessionsRequest(page_size=500, page_token=token))
        sessions += sum(1 for s in listed.sessions if s.namespace == namespace)
        token = listed.next_page_token
        if not token:
            return memories, sessions


MODES = (("vectors", ()), ("text", ("--text",)))


async def main(memories: int, sessions: int, messages: int) -> None:
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        exported: dict[str, tuple[Path, float]] = {}
        async with Stack(root / "a", services=SERVICES) as stack:
            fill_s = await _fill(stack, memories, sessions, messages)
            for mode, flags in MODES:
                export = root / f"bench-{mode}.jsonl"
                with export.open("w") as out:
                    export_s, _ = await _cli(stack, "export", NAMESPACE, *flags, stdout=out)
                exported[mode] = (export, export_s)
        for mode, (export, export_s) in exported.items():
            async with Stack(root / f"b-{mode}", services=SERVICES) as stack:
                import_s, _ = await _cli(stack, "import", str(export), "--namespace", "moved")
                arrived = await _count(stack, "moved")
            rows.append(f"| {mode} | {memories} | {sessions} | {export_s:.1f} s | {import_s:.1f} s | "
                        f"{export.stat().st_size / 1e6:.1f} MB |")
            if arrived != (memories, sessions):
                failed.append(f"{mode}: {arrived}")
    print(f"filled {memories} memories and {sessions} sessions ({messages} messages each) in {fill_s:.1f} s; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| memories as | memories | sessions | export | import | file |\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    if failed:
        raise SystemExit(f"the import did not bring everything: {failed}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=4)
    a = parser.parse_args()
    asyncio.run(main(a.memories, a.sessions, a.messages))
