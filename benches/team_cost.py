"""What a team costs in model tokens against one agent doing the same tasks (docs/teams.md,
"Benchmark"): a real stack (tests/support/stack.py: the five services over real gRPC) and the
scripted model (tests/support/llm_server.py), whose answers do the same work both ways.

- team: the lead puts `--tasks` tasks on its board, spawns `--mates` teammates, and reads its
  inbox until each task is reported finished; each teammate claims a free task (`task_claim`),
  marks it done (`task_update`), reports it to the lead (`send_message`), and claims the next,
  until none is free; then it ends (idle).
- one agent (the baseline, same run): the same `--tasks` tasks created, each taken
  (`task_update` to in_progress) and marked done, then the answer.

What it counts, per model call the agent makes: input tokens as the characters of the request's
`messages` and `tools` (JSON) / 4, output tokens as the characters of the scripted answer's text
and tool calls (JSON) / 4 — the scripted server has no tokenizer, and a real model's answers
would be longer, so read it as the prompt overhead of coordination: the teammates' own system
prompts and tool lists, the mail, and the lead's inbox reads. The same estimate is reported to
the agent as each call's usage.

    python -m benches.team_cost [--mates 3] [--tasks 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
from collections import defaultdict
from pathlib import Path

__all__ = ["measure"]


def _tokens(value) -> int:
    return max(1, len(json.dumps(value)) // 4)


class Model:
    """The scripted model for both runs: who is asking is told by the system prompt (a teammate)
    or the first user message (TEAM or SOLO)."""

    def __init__(self, tasks: int, mates: int):
        self.tasks, self.mates = tasks, mates
        self.spent: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def __call__(self, request):
        from tests.support.llm_server import reply

        messages = request.messages
        who = self._who(messages)
        answer = self._answer(who, messages)
        spent_in = _tokens({"messages": messages, "tools": request.body.get("tools") or []})
        spent_out = _tokens({"text": answer.text, "calls": [(c.name, c.arguments_json) for c in answer.tool_calls]})
        self.spent[who].append((spent_in, spent_out))
        return reply(answer.text, *answer.tool_calls, usage=(spent_in, spent_out))

    @staticmethod
    def _who(messages) -> str:
        system = str(messages[0].get("content") or "") if messages else ""
        found = re.search(r"You are (m\d+), a teammate", system)
        if found:
            return found.group(1)
        first = next((str(m.get("content") or "") for m in messages if m["role"] == "user"), "")
        return "lead" if first.startswith("TEAM") else "solo"

    def _answer(self, who: str, messages):
        from tests.support.llm_server import reply, tool_call

        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                 for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        seen = "\n".join(str(m.get("content") or "") for m in messages if m["role"] in ("tool", "user"))
        names = [n for n, _ in calls]
        subjects = [f"task {i}" for i in range(1, self.tasks + 1)]
        if who in ("lead", "solo") and "task_create" not in names:
            return reply("Planning.", *(tool_call("task_create", {"subject": s}) for s in subjects))
        if who == "solo":
            updates = [(a["id"], a["status"]) for n, a in calls if n == "task_update"]
            for i in range(1, self.tasks + 1):
                for status in ("in_progress", "done"):
                    if (i, status) not in updates:
                        return reply("", tool_call("task_update", {"id": i, "status": status}))
            return reply(f"All {self.tasks} tasks done.")
        if who == "lead":
            if "spawn_teammate" not in names:
                return reply("", *(tool_call("spawn_teammate", {"name": f"m{i}", "role": "worker", "task": "Take tasks."})
                                   for i in range(1, self.mates + 1)))
            if len(set(re.findall(r"finished #(\d+)", seen))) < self.tasks:
                return reply("", tool_call("read_inbox", {"wait_s": 60}))
            return reply(f"All {self.tasks} tasks done by the team.")
        done = {a["id"] for n, a in calls if n == "task_update"}
        reported = {a["text"] for n, a in calls if n == "send_message"}
        for task_id in map(int, re.findall(rf"Claimed \[~\] #(\d+) [^@\n]*@{who}", seen)):
            if task_id not in done:
                return reply("", tool_call("task_update", {"id": task_id, "status": "done"}))
            if f"finished #{task_id}" not in reported:
                return reply("", tool_call("send_message", {"to": "lead", "text": f"finished #{task_id}"}))
        last = messages[-1]
        if last["role"] == "tool" and "no pending task is free" in str(last.get("content")):
            return reply("Nothing left for me.")
        return reply("", tool_call("task_claim", {}))


async def measure(mates: int, tasks: int) -> dict[str, dict[str, int]]:
    """Model calls and estimated tokens, for the team (lead and teammates) and for one agent."""
    from agentmesh.v1 import gateway_pb2
    from tests.support.llm_server import ScriptedLLMServer
    from tests.support.stack import Stack

    model = Model(tasks, mates)
    env = {"AGENTMESH_AGENT_TEAM_IDLE_S": "0.5", "AGENTMESH_AGENT_TEAM_INBOX_WAIT_S": "60",
           "AGENTMESH_LOG_LEVEL": "warning", "AGENTMESH_TRACES": "none"}
    with tempfile.TemporaryDirectory(prefix="agentmesh-team-cost-") as home, ScriptedLLMServer(default=model) as llm:
        async with Stack(Path(home), llm_base_url=llm.base_url, env=env) as stack:
            gateway = stack.gateway_stub()
            for session, message in (("solo-1", "SOLO: do the tasks."), ("team-1", "TEAM: do the tasks as a team.")):
                request = gateway_pb2.ChatRequest(session_id=session, message=message,
                                                  options=gateway_pb2.ChatOptions(max_iterations=100))
                async for _ in gateway.Chat(request, timeout=600):
                    pass
            # The teammates end once idle: wait until each has answered its last call.
            for _ in range(600):
                team = await gateway.GetTeam(gateway_pb2.GetTeamRequest(session_id="team-1"), timeout=10)
                if team.teammates and all(m.state == "finished" for m in team.teammates):
                    break
                await asyncio.sleep(0.1)
            assert [t.status for t in team.tasks] == ["done"] * tasks, "the team left a task undone"
    out: dict[str, dict[str, int]] = {}
    for who, spent in model.spent.items():
        out[who] = {"calls": len(spent), "input": sum(i for i, _ in spent), "output": sum(o for _, o in spent)}
    return out


def report(cost: dict[str, dict[str, int]], mates: int, tasks: int) -> None:
    solo = cost.get("solo", {"calls": 0, "input": 0, "output": 0})
    team = {k: sum(v[k] for who, v in cost.items() if who != "solo") for k in ("calls", "input", "output")}
    print(f"token cost of {tasks} tasks (estimate: JSON characters / 4; see benches/team_cost.py)")
    print(f"  one agent alone (baseline): {solo['calls']:4d} model calls, {solo['input']:7d} in, {solo['output']:5d} out")
    print(f"  lead and {mates} teammates:      {team['calls']:4d} model calls, {team['input']:7d} in, {team['output']:5d} out"
          f"   ({(team['input'] + team['output']) / max(1, solo['input'] + solo['output']):.1f}x the tokens)")
    for who in sorted(w for w in cost if w != "solo"):
        v = cost[who]
        print(f"    {who:<5} {v['calls']:4d} calls, {v['input']:7d} in, {v['output']:5d} out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mates", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=6)
    args = parser.parse_args()
    os.environ.setdefault("AGENTMESH_LOG_LEVEL", "warning")
    report(asyncio.run(measure(args.mates, args.tasks)), args.mates, args.tasks)


if __name__ == "__main__":
    main()
