"""Runs over the command line and HTTP against the real stack (docs/api.md, "Runs"):
`agentmesh chat --submit` prints a run id and exits while the turn runs on with no client;
`agentmesh runs show|join|list|cancel` and the /v1/runs routes read, follow and stop it."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
import pytest
from httpx_sse import aconnect_sse

from agentmesh.v1 import gateway_pb2
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack

APPROVAL = {"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=APPROVAL) as running:
        yield running


async def cli(stack, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "agentmesh.cli.main", *args, env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, out.decode(), err.decode()


async def run_state(gateway, run_id: str, state: str) -> None:
    """Until GetRun says `state` (a generous bound, not a timing claim)."""
    async with asyncio.timeout(30):
        while (await gateway.GetRun(gateway_pb2.GetRunRequest(run_id=run_id), timeout=10)).state != state:
            await asyncio.sleep(0.05)


async def test_chat_submit_returns_a_run_id_while_the_run_goes_on_and_runs_follows_it(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("Checking.", tool_call("shell", {"command": "echo submitted"}, id="c1")), reply("All done."))

    code, out, err = await cli(stack, "chat", "--submit", "--session", "sub", "run the echo")
    assert code == 0, err
    run_id = out.strip()
    assert run_id.startswith("run")
    # The client is gone; the run holds its tool call for approval, and says so.
    await run_state(gateway, run_id, "waiting_for_approval")
    code, out, err = await cli(stack, "runs", "show", run_id)
    assert code == 0 and "waiting_for_approval" in out, err

    joining = asyncio.create_task(cli(stack, "runs", "join", run_id, "--json"))
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="sub", call_id="c1", approved=True), timeout=10)
    code, out, err = await joining
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "run_finished"
    assert events[0]["run_id"] == run_id and events[-1]["final_text"] == "All done."

    await run_state(gateway, run_id, "succeeded")
    code, out, err = await cli(stack, "runs", "list", "--session", "sub", "--json")
    assert code == 0, err
    [listed] = json.loads(out)
    assert listed["run_id"] == run_id and listed["state"] == "succeeded" and listed["stop_reason"] == "completed"
    assert int(listed["usage"]["total_tokens"]) > 0

    code, out, err = await cli(stack, "runs", "show", "run-nope")
    assert code != 0 and "there is no run 'run-nope'" in err


async def test_runs_over_http_create_join_get_list_and_cancel(stack, llm):
    llm.add(reply("Checking.", tool_call("shell", {"command": "echo http"}, id="c1")))
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=60) as client:
        created = await client.post("/v1/sessions/web/runs", json={"message": "run the echo"})
        assert created.status_code == 200, created.text
        run_id = created.json()["run_id"]
        await run_state(stack.gateway_stub(), run_id, "waiting_for_approval")

        seen: list[str] = []

        async def join() -> None:
            async with aconnect_sse(client, "GET", f"/v1/runs/{run_id}/join") as source:
                async for sse in source.aiter_sse():
                    seen.append(sse.event)
                    if sse.event in ("run_finished", "error"):
                        return

        joined = asyncio.create_task(join())
        async with asyncio.timeout(30):
            while "approval_request" not in seen:
                await asyncio.sleep(0.05)
        cancelled = await client.post(f"/v1/runs/{run_id}:cancel", json={})
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["state"] == "cancelled" and cancelled.json()["stop_reason"] == "cancelled"
        await asyncio.wait_for(joined, 30)
        assert seen[0] == "run_started" and seen[-1] == "run_finished"

        got = await client.get(f"/v1/runs/{run_id}")
        assert got.status_code == 200 and got.json()["state"] == "cancelled"
        listed = await client.get("/v1/runs", params={"states": "cancelled"})
        assert [r["run_id"] for r in listed.json()["runs"]] == [run_id]
        missing = await client.get("/v1/runs/run-nope")
        assert missing.status_code == 404 and "there is no run 'run-nope'" in missing.text
