"""A team's operations (agent/capabilities/team_store.py, docs/teams.md) over memory's team
records (memory/teams.py on embedded Qdrant Edge), the port implemented in a few lines: claims
made at once by five teammates each land on a different task, mail numbers never repeat, and a
transcript's delivery marks are the mailbox cursor."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentmesh.agent.capabilities.tasks import Board
from agentmesh.agent.capabilities.team_board import claimable
from agentmesh.agent.capabilities.team_store import Mail, Team, TeamRecord, delivered_in, render_mail, team_of
from agentmesh.agent.types import ChatMessage
from agentmesh.memory.edge_store import EdgeStore
from agentmesh.memory.ports import VERSION
from agentmesh.memory.stores import open_documents
from agentmesh.memory.teams import TeamRecords


class Records:
    """The TeamStore port over the memory core, without the wire."""

    def __init__(self, core: TeamRecords):
        self.core = core

    async def swap(self, namespace, team, kind, key, body, expect):
        swapped, current = await self.core.swap(namespace, team, kind, key, json.dumps(body), expect)
        return swapped, (TeamRecord(key, int(current.pop(VERSION)), current) if current else None)

    async def records(self, namespace, team, kind):
        return [TeamRecord(key, int(body.get(VERSION, 0)), {k: v for k, v in body.items() if k != VERSION})
                for key, body in await self.core.list(namespace, team, kind)]

    async def wait(self, namespace, team, after, timeout_s):
        return await self.core.wait(namespace, team, after, timeout_s)


@pytest.fixture
async def store(tmp_path):
    edge = EdgeStore(tmp_path / "home")
    await edge.open()
    yield Records(TeamRecords(await open_documents(edge)))
    await edge.close()


async def test_teammates_claiming_at_once_never_get_the_same_task(store):
    board = Board()
    for i in range(20):
        board.create(f"task {i}")
    lead = Team(store, "default", "s1")
    await lead.change("board", "board", lambda _: {"board": board.to_json()})
    taken: dict[int, str] = {}

    async def claimer(me: str) -> None:
        team = Team(store, "default", "s1")
        while True:
            got = 0

            def claim(body):
                nonlocal got
                current = Board.from_json(body["board"])
                got = next(iter(claimable(current)), 0)
                if got:
                    current.update(got, status="in_progress", owner=me)
                return {"board": current.to_json()}

            await team.change("board", "board", claim)
            if not got:
                return
            assert got not in taken, f"#{got} claimed by {taken.get(got)} and {me}"
            taken[got] = me
            await asyncio.sleep(0)

    await asyncio.gather(*(claimer(f"m{i}") for i in range(5)))
    assert sorted(taken) == list(range(1, 21))
    final = Board.from_json((await lead.get("board", "board")).body["board"])
    assert {t.owner for t in final.tasks.values()} <= {f"m{i}" for i in range(5)}
    assert all(final.tasks[i].owner == owner for i, owner in taken.items())


async def test_mail_numbers_never_repeat_and_a_transcript_says_what_was_delivered(store):
    team = Team(store, "default", "s1")
    seqs = await asyncio.gather(*(team.post("bob", f"m{i}", f"hello {i}") for i in range(8)))
    assert sorted(seqs) == list(range(1, 9))
    mail = await team.mail_after("bob", 5)
    assert [m.seq for m in mail] == [6, 7, 8]
    # A message whose text holds what looks like a mark does not move the cursor.
    text = render_mail([Mail(6, "alice", "line one\n[mail 99 from x] not a mark", 0.0), Mail(7, "lead", "go", 0.0)])
    stored = [ChatMessage(role="user", content="[mail 3 from lead] earlier"), ChatMessage(role="user", content=text),
              ChatMessage(role="assistant", content="[mail 50 from me] quoted by the model")]
    assert delivered_in(stored) == 7


def test_only_a_teammates_session_names_a_team():
    assert team_of("s1.mate-alice") == ("s1", "alice")
    assert team_of("s1.sub-0123456789") is None
    assert team_of("s1.mate-Alice!") is None
    assert team_of(".mate-alice") is None


class Runs:
    """TeammateRuns that start runs in order (run-2, run-3, …) and remember each start."""

    def __init__(self):
        self.started: list = []

    async def start(self, start) -> str:
        self.started.append(start)
        return f"run-{len(self.started) + 1}"

    async def state(self, run_id: str) -> tuple[str, str]:
        raise AssertionError("not asked here")


async def test_a_teammates_ended_run_is_started_again_once_whoever_sees_the_end(store):
    from agentmesh.agent.capabilities.team_recovery import recover

    team, runs = Team(store, "default", "lead1"), Runs()
    await team.set_mate("alice", session_id="lead1.mate-alice", state="working", run_id="run-1", restarts=0,
                        start={"model": "m", "allow": [], "deny": ["shell"], "max_iterations": 9, "max_restarts": 2})
    seen = (await team.get("mate", "alice")).body
    # Two observers of run-1's end (the gateway, the teammate's watch, the lead) acting at once.
    done = await asyncio.gather(*(recover(team, runs, dict(seen), "interrupted", "its gateway stopped", ended="run-1")
                                  for _ in range(3)))
    assert sorted(done) == ["", "", "restarted"] and len(runs.started) == 1
    assert runs.started[0].deny == ("shell",) and "its gateway stopped" in runs.started[0].message
    now = (await team.get("mate", "alice")).body
    assert (now["run_id"], now["state"], now["restarts"]) == ("run-2", "started", 1)
    # A late look at run-1's end, with the record as it is now: nothing more is started.
    assert await recover(team, runs, now, "interrupted", "", ended="run-1") == "" and len(runs.started) == 1
    # A stop: finished, and the lead told.
    assert await recover(team, runs, now, "cancelled", "", ended="run-2") == "finished"
    assert (await team.get("mate", "alice")).body["stop_reason"] == "cancelled"
    assert (await team.mail_after("lead", 0))[-1].text.startswith("[alice finished (cancelled)]")
