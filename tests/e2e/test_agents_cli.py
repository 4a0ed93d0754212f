"""`agentmesh agents ...` and `agentmesh chat --agent` against the whole stack: an agent defined
from a `kind: Agent` YAML file, edited to version 2, rolled back, shown back as the same YAML, and
run by name; a malformed file is a usage error that changes nothing."""

from __future__ import annotations

import json

import yaml

from agentmesh.v1 import gateway_pb2
from tests.e2e.test_auth_and_cli import run_cli
from tests.support.llm_server import reply

AGENT = """\
apiVersion: agentmesh.dev/v1alpha1
kind: Agent
metadata:
  name: reviewer
  namespace: team-a
spec:
  description: Reviews a change and reports problems.
  instructions: {instructions}
  modelParameters: {{temperature: 0.2}}
  tools: {{allow: [read_file, grep], permissionMode: normal, approvals: [shell]}}
  subAgents: [explore]
  budgets: {{steps: 7, tokens: 50000}}
"""


async def test_define_edit_roll_back_show_and_chat_with_an_agent_from_the_cli(stack, llm, tmp_path):
    path = tmp_path / "reviewer.yaml"
    path.write_text(AGENT.format(instructions="You are REVIEWER ONE."))
    code, out, err = await run_cli(stack, "agents", "create", "-f", str(path))
    assert code == 0, err
    assert out.startswith("created reviewer v1")

    path.write_text(AGENT.format(instructions="You are REVIEWER TWO."))
    code, out, err = await run_cli(stack, "agents", "edit", "-f", str(path))
    assert code == 0 and out.startswith("updated reviewer v2"), err

    code, out, err = await run_cli(stack, "agents", "rollback", "reviewer", "1", "--namespace", "team-a")
    assert code == 0 and "reviewer v3" in out and "a copy of v1" in out, err
    code, out, _ = await run_cli(stack, "agents", "versions", "reviewer", "--namespace", "team-a", "--json")
    assert [(v["version"], v["rolled_back_from"]) for v in json.loads(out)] == [(1, 0), (2, 0), (3, 1)]

    code, out, _ = await run_cli(stack, "agents", "show", "reviewer@2", "--namespace", "team-a")
    shown = yaml.safe_load(out)
    assert shown["spec"]["instructions"] == "You are REVIEWER TWO."
    assert shown["spec"]["tools"] == {"allow": ["read_file", "grep"], "permissionMode": "normal",
                                      "approvals": ["shell"]}
    assert shown["spec"]["budgets"] == {"steps": 7, "tokens": 50000}
    # What `show` prints is a file `create` reads: the same shape both ways.
    assert shown == yaml.safe_load(AGENT.format(instructions="You are REVIEWER TWO.")) | {"spec": shown["spec"]}

    code, out, _ = await run_cli(stack, "agents", "list", "--namespace", "team-a")
    assert [line.split()[0] for line in out.splitlines()] == ["code", "explore", "plan", "reviewer"]

    # chat --agent, in a session of that namespace.
    await stack.gateway_stub().CreateSession(gateway_pb2.CreateSessionRequest(session_id="review-1",
                                                                              namespace="team-a"))
    llm.add(reply("looks fine"))
    code, out, err = await run_cli(stack, "chat", "review it", "--session", "review-1", "--agent", "reviewer", "--json")
    assert code == 0, err
    assert "You are REVIEWER ONE." in llm.requests[-1].messages[0]["content"]

    code, out, _ = await run_cli(stack, "agents", "delete", "reviewer", "--namespace", "team-a")
    assert code == 0 and "3 versions" in out


async def test_a_malformed_file_is_a_usage_error_and_changes_nothing(stack, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: agentmesh.dev/v1alpha1\nkind: Agent\nmetadata: {name: x}\nspec: {soul: hi}\n")
    code, _, err = await run_cli(stack, "agents", "create", "-f", str(path))
    assert code == 2 and "unknown fields: soul" in err
    path.write_text("apiVersion: agentmesh.dev/v1alpha1\nkind: Agent\nmetadata: {name: x}\nspec: {instructions: ''}\n")
    code, _, err = await run_cli(stack, "agents", "create", "-f", str(path))
    assert code != 0 and "instructions" in err
    code, out, _ = await run_cli(stack, "agents", "list")
    assert [line.split()[0] for line in out.splitlines()] == ["code", "explore", "plan"]
