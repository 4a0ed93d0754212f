"""An acknowledged write survives `kill -9` of the memory service: real processes, real gRPC.

The service runs as `agentmesh serve memory` in a child process. A client appends messages and
remembers memories as fast as it can; the process is killed with SIGKILL in the middle of the
burst (no shutdown hook runs, nothing is flushed); a new process on the same home must hold every
write the dead one acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from agentmesh.clients.memory import MemoryClient
from agentmesh.errors import AgentmeshError
from agentmesh.internal.v1 import memory_service_pb2
from agentmesh.v1 import common_pb2
from tests.support.identities import signed_channel

pytestmark = pytest.mark.slow


class ServiceProcess:
    def __init__(self, home: Path, env: dict[str, str] | None = None):
        self.home = home
        self.env = {
            **os.environ,
            "AGENTMESH_HOME": str(home),
            "AGENTMESH_LISTEN_ADDR": "127.0.0.1:0",
            "AGENTMESH_TRACES": "none",
            "AGENTMESH_DRAIN_S": "1",
            **(env or {}),
        }
        self.proc: asyncio.subprocess.Process | None = None
        self.output: list[str] = []

    async def start(self) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentmesh.cli.main", "serve", "memory", env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        while True:
            line = (await asyncio.wait_for(self.proc.stdout.readline(), 60)).decode()
            self.output.append(line)
            if not line:
                raise AssertionError("the memory service exited:\n" + "".join(self.output))
            if "service started" in line:
                port = re.search(r"\"port\": (\d+)", line).group(1)
                asyncio.get_running_loop().create_task(self._drain())
                return f"127.0.0.1:{port}"

    async def _drain(self) -> None:
        while self.proc and self.proc.stdout and (line := await self.proc.stdout.readline()):
            self.output.append(line.decode())

    def channel(self, target: str):
        """Transcripts take writes from the agent only: the test signs its calls as the agent."""
        return signed_channel(self.home / "keys", "agent", "memory", target)

    async def wait(self) -> int:
        return await self.proc.wait()

    async def stop(self) -> None:
        """SIGTERM, and SIGKILL if it has not exited in 15 s: a test never leaves a service behind."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def test_acknowledged_appends_and_memories_survive_kill_9(tmp_path):
    home = tmp_path / "home"
    first, second = ServiceProcess(home), ServiceProcess(home)
    try:
        await kill_mid_burst_and_compare(first, second)
    finally:
        await first.stop()
        await second.stop()


async def test_acknowledged_memories_survive_kill_9_in_a_namespace_of_many_parts(tmp_path):
    """Parts of 8 memories: the burst seals parts and opens new ones while it is killed."""
    home = tmp_path / "home"
    parts = {"AGENTMESH_MEMORY_PART_SIZE": "8"}
    first, second = ServiceProcess(home, parts), ServiceProcess(home, parts)
    try:
        await kill_mid_burst_and_compare(first, second)
        assert len(list((home / "memory" / "memories" / "crash").glob("part-*"))) >= 3
    finally:
        await first.stop()
        await second.stop()


async def kill_mid_burst_and_compare(first: ServiceProcess, second: ServiceProcess) -> None:
    target = await first.start()
    channel = first.channel(target)
    # The deadline bounds a hang, not speed: a namespace of many parts under a loaded run took over 5 s
    # for one remember, and the writer died before the kill it was there to see.
    client = MemoryClient(channel, target=target, timeout_s=60)
    await client.put_session("burst")
    acked_seq: list[int] = []
    acked_memories: list[str] = []

    async def append_forever():
        for i in range(1, 1_000_000):
            seq = await client.append_messages("burst", [common_pb2.Message(role="user", content=f"message {i}")])
            acked_seq.append(seq)

    async def remember_forever():
        for i in range(1_000_000):
            record = await client.remember(f"fact number {i} about crash safety", namespace="crash")
            acked_memories.append(record.id)

    writers = [asyncio.create_task(append_forever()), asyncio.create_task(remember_forever())]
    while len(acked_seq) < 300 or len(acked_memories) < 30:
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in writers), [w.exception() for w in writers if w.done()]
    first.proc.send_signal(signal.SIGKILL)  # mid-burst: both writers have calls in flight
    assert await first.wait() == -signal.SIGKILL
    for writer in writers:
        with pytest.raises(AgentmeshError):
            await writer
    await channel.close()

    target = await second.start()
    channel = second.channel(target)
    client = MemoryClient(channel, target=target)
    try:
        transcript = await client.transcript("burst")
        # Every acknowledged append is there, in order; at most the one in flight beyond it.
        assert [m.content for m in transcript[: len(acked_seq)]] == [f"message {i}" for i in range(1, len(acked_seq) + 1)]
        assert [m.seq for m in transcript[: len(acked_seq)]] == acked_seq
        assert len(transcript) - len(acked_seq) in (0, 1)
        for memory_id in acked_memories:
            assert (await client.get_memory(memory_id, namespace="crash")).id == memory_id
        # And the service keeps working on the recovered store.
        assert await client.append_messages("burst", [common_pb2.Message(role="user", content="after")]) == len(transcript) + 1
    finally:
        await channel.close()


async def test_a_second_memory_process_on_the_same_home_is_refused_clearly(tmp_path):
    home = tmp_path / "home"
    first, second = ServiceProcess(home), ServiceProcess(home)
    try:
        await first.start()
        with pytest.raises(AssertionError, match="in use by another process"):
            await second.start()
        assert await second.wait() not in (None, 0)
    finally:
        await first.stop()
        await second.stop()


async def test_nothing_acknowledged_is_lost_when_the_service_is_killed_during_an_index_build(tmp_path):
    """A namespace bulk-imported with builds off; the next service builds it on first use and
    takes new memories meanwhile; `kill -9` in the middle of the build (the indexer dies with it)
    loses no acknowledged memory, and the service after it builds the namespace again."""
    home = tmp_path / "home"
    importer = ServiceProcess(home, {"AGENTMESH_MEMORY_INDEX_AFTER": "0"})
    building = ServiceProcess(home, {"AGENTMESH_MEMORY_INDEX_AFTER": "500"})
    after = ServiceProcess(home, {"AGENTMESH_MEMORY_INDEX_AFTER": "500"})
    try:
        target = await importer.start()
        channel = importer.channel(target)
        client = MemoryClient(channel, target=target, timeout_s=30)
        for start in range(0, 3000, 500):
            batch = [memory_service_pb2.RememberRequest(text=f"imported fact {i} about shards", kind="knowledge")
                     for i in range(start, start + 500)]
            await client.import_memories(batch, namespace="bulk")
        await channel.close()
        await importer.stop()

        target = await building.start()
        channel = building.channel(target)
        client = MemoryClient(channel, target=target, timeout_s=60)  # a bound against a hang, not a measure of speed
        assert len(await client.search("imported fact 7", namespace="bulk", k=3)) == 3  # starts the build
        acked: list[str] = []

        async def remember_forever():
            for i in range(1_000_000):
                acked.append((await client.remember(f"new fact {i} during the build", namespace="bulk")).id)

        writer = asyncio.create_task(remember_forever())
        async with asyncio.timeout(60):
            while not any('"memory shard indexing"' in line for line in building.output) or len(acked) < 20:
                await asyncio.sleep(0.01)
                assert not writer.done(), writer.exception()
        assert not any('"memory shard indexed"' in line for line in building.output), "the build ended before the kill"
        building.proc.send_signal(signal.SIGKILL)
        assert await building.wait() == -signal.SIGKILL
        with pytest.raises(AgentmeshError):
            await writer
        await channel.close()

        target = await after.start()
        channel = after.channel(target)
        client = MemoryClient(channel, target=target, timeout_s=30)
        try:
            for memory_id in acked:
                assert (await client.get_memory(memory_id, namespace="bulk")).id == memory_id
            hits = await client.search("new fact during the build", namespace="bulk", k=5)
            assert hits and all("during the build" in h.memory.text for h in hits)
            root = home / "memory" / "memories" / "bulk"
            async with asyncio.timeout(120):  # the first use started the build again, and it ends
                while not any('"memory shard indexed"' in line for line in after.output):
                    await asyncio.sleep(0.1)
            current = json.loads((root / "CURRENT").read_text())
            assert sorted(p.name for p in root.glob("gen-*")) == [f"gen-{current['generation']:04d}"]
            assert current["indexed_points"] >= 3000 + len(acked)
            for memory_id in acked:
                assert (await client.get_memory(memory_id, namespace="bulk")).id == memory_id
        finally:
            await channel.close()
    finally:
        for service in (importer, building, after):
            await service.stop()
