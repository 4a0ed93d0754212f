"""What a team's coordination costs: claims per second on one shared board, and the latency of a
message from one teammate to another (docs/teams.md), against a real memory service
(`agentmesh serve memory`, its own process, embedded Qdrant Edge), called the way agent
replicas call it — each teammate with a channel of its own, signed as the agent.

- claims: a board of `--tasks` tasks; `--mates` teammates claim the first free task at once, each
  claim a compare-and-set (team_store.Team.change) retried on conflict, until none is left.
  Baseline, in the same run: one agent claiming the same board alone (no conflicts). Checked:
  every task is claimed exactly once.
- messages: `--messages` messages, one at a time, from a sender to a receiver waiting in
  `WaitTeam`; latency from the post's start to the receiver holding the message, p50/p99.

    python -m benches.teams [--mates 5] [--tasks 200] [--messages 200] [--idle-s 0]

- messages across memory replicas: the same, with the sender's and the receiver's teammates on
  two memory replicas sharing one store (two `TeamRecords` over one embedded store, in this
  process — as two memory pods share a Qdrant server; two memory processes cannot share the
  embedded store): the receiver's wait on its replica sees the other's change by polling the
  store (memory/teams.py). Baseline, in the same run: both on one replica (woken at once).

What it does not measure: a model — the token cost of a team against one agent doing the same
tasks is `python -m benches.team_cost` (a whole stack and the scripted model) — nor two memory
processes over a Qdrant server (there is none on this machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time

from benches._contenders import free_address, service


async def _latency(sender, receiver, messages: int, idle_s: float = 0.0) -> tuple[float, float]:
    """p50 and p99 (ms) of a message from `sender` to `receiver` (Teams) waiting in WaitTeam,
    posted `idle_s` after the receiver began to wait."""
    latencies: list[float] = []
    change = await receiver.wait(-1, 0)
    for i in range(messages):
        async def receive(after: int) -> int:
            nonlocal change
            while True:
                got = await receiver.mail_after("bob", after)
                if got:
                    return got[-1].seq
                change = await receiver.wait(change, 5)

        waiting = asyncio.create_task(receive(i))
        await asyncio.sleep(idle_s)  # the receiver is waiting before the post
        started = time.perf_counter()
        await sender.post("bob", "alice", f"message {i}")
        await waiting
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    return statistics.median(latencies) * 1000, latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000


async def _across_replicas(home: str, messages: int, idle_s: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """Message latency with both teammates on one memory replica, then on two sharing one store."""
    import json

    from agentmesh.agent.capabilities.team_store import Team, TeamRecord
    from agentmesh.memory.edge_store import EdgeStore
    from agentmesh.memory.stores import open_documents
    from agentmesh.memory.teams import TeamRecords

    class Replica:
        """A TeamStore over one memory replica's core, as the agent's gRPC adapter reaches it."""

        def __init__(self, core: TeamRecords):
            self.core = core

        async def swap(self, namespace, team, kind, key, body, expect):
            swapped, current = await self.core.swap(namespace, team, kind, key, json.dumps(body), expect)
            return swapped, (TeamRecord(key, int(current.pop("_v", 0)), current) if current is not None else None)

        async def records(self, namespace, team, kind):
            return [TeamRecord(key, int(body.pop("_v", 0)), body) for key, body in
                    await self.core.list(namespace, team, kind)]

        async def wait(self, namespace, team, after, timeout_s):
            return await self.core.wait(namespace, team, after, timeout_s)

    store = EdgeStore(os.path.join(home, "replicas"))
    await store.open()
    try:
        documents = await open_documents(store)
        one, other = Replica(TeamRecords(documents)), Replica(TeamRecords(documents))
        same = await _latency(Team(one, "default", "same"), Team(one, "default", "same"), messages, idle_s)
        across = await _latency(Team(other, "default", "across"), Team(one, "default", "across"), messages, idle_s)
        return same, across
    finally:
        await store.close()


async def _main(mates: int, tasks: int, messages: int, idle_s: float) -> None:
    from agentmesh.agent.adapters.teams import GrpcTeamStore
    from agentmesh.agent.capabilities.tasks import Board
    from agentmesh.agent.capabilities.team_board import claimable
    from agentmesh.agent.capabilities.team_store import Team
    from agentmesh.clients.memory import MemoryClient
    from agentmesh.config import Settings
    from agentmesh.rpc.client import open_channel
    from agentmesh.rpc.identity import ServiceIdentity
    from agentmesh.telemetry import setup_telemetry

    home = tempfile.mkdtemp(prefix="agentmesh-teams-bench-")
    address = free_address()
    env = {**os.environ, "AGENTMESH_HOME": home, "AGENTMESH_MEMORY_ADDR": address, "AGENTMESH_TRACES": "none",
           "AGENTMESH_LOG_LEVEL": "warning"}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, home, ignore_errors=True)
        cleanup.enter_context(service("memory", env))
        settings = Settings.from_env({"AGENTMESH_HOME": home, "AGENTMESH_TRACES": "none"})
        telemetry = setup_telemetry("agent", settings)
        identity = ServiceIdentity.open("agent", settings.keys_dir)

        async def team_of(name: str) -> Team:
            channel = open_channel(address, telemetry, identity=identity, audience="memory")
            await asyncio.wait_for(channel.channel_ready(), 60)
            return Team(GrpcTeamStore(MemoryClient(channel, address)), "default", name)

        async def claims(team_id: str, workers: int) -> tuple[float, int]:
            teams = [await team_of(team_id) for _ in range(workers)]
            board = Board()
            for i in range(tasks):
                board.create(f"task {i}")
            await teams[0].change("board", "board", lambda _: {"board": board.to_json()})
            taken: list[int] = []

            async def claimer(team: Team, me: str) -> None:
                while True:
                    got = 0

                    def claim(body):
                        nonlocal got
                        current = Board.from_json(body["board"])
                        free = claimable(current)
                        got = free[0] if free else 0
                        if got:
                            current.update(got, status="in_progress", owner=me)
                        return {"board": current.to_json()}

                    await team.change("board", "board", claim)
                    if not got:
                        return
                    taken.append(got)

            started = time.perf_counter()
            await asyncio.gather(*(claimer(t, f"m{i}") for i, t in enumerate(teams)))
            elapsed = time.perf_counter() - started
            assert sorted(taken) == list(range(1, tasks + 1)), "a task was claimed twice or not at all"
            return tasks / elapsed, len(taken)

        alone, _ = await claims("bench-alone", 1)
        together, _ = await claims("bench-team", mates)

        sender, receiver = await team_of("bench-mail"), await team_of("bench-mail")
        p50, p99 = await _latency(sender, receiver, messages)
        (same50, same99), (across50, across99) = await _across_replicas(home, messages, idle_s)
        load = os.getloadavg()[0]
        print(f"load average {load:.2f} on {os.cpu_count()} cores")
        print(f"claims/s, one agent alone (baseline): {alone:8.1f}")
        print(f"claims/s, {mates} teammates at once:     {together:8.1f}   (every task claimed once)")
        print(f"message latency, each teammate its own channel: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
              f"over {messages} messages")
        if idle_s:
            print(f"(across memory replicas: each message posted {idle_s:g}s after its receiver began to wait)")
        print(f"message latency, one memory replica (baseline): p50 {same50:.1f} ms, p99 {same99:.1f} ms")
        print(f"message latency, two memory replicas, one store: p50 {across50:.1f} ms, p99 {across99:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mates", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--idle-s", type=float, default=0.0,
                        help="across memory replicas, post each message this long after the receiver began to wait")
    args = parser.parse_args()
    asyncio.run(_main(args.mates, args.tasks, args.messages, args.idle_s))


if __name__ == "__main__":
    main()
