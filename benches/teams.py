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

    python -m benches.teams [--mates 5] [--tasks 200] [--messages 200]

What it does not measure: a model — the token cost of a team against one agent doing the same
tasks is `python -m benches.team_cost` (a whole stack and the scripted model) — and two memory
replicas (the embedded store is one process's).
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


async def _main(mates: int, tasks: int, messages: int) -> None:
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
            await asyncio.sleep(0)  # the receiver is waiting before the post
            started = time.perf_counter()
            await sender.post("bob", "alice", f"message {i}")
            await waiting
            latencies.append(time.perf_counter() - started)
        latencies.sort()
        p50 = statistics.median(latencies) * 1000
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        load = os.getloadavg()[0]
        print(f"load average {load:.2f} on {os.cpu_count()} cores")
        print(f"claims/s, one agent alone (baseline): {alone:8.1f}")
        print(f"claims/s, {mates} teammates at once:     {together:8.1f}   (every task claimed once)")
        print(f"message latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms over {messages} messages")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mates", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--messages", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(_main(args.mates, args.tasks, args.messages))


if __name__ == "__main__":
    main()
