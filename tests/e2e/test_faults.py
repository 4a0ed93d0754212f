"""Faults as real processes: `agentmesh up` stopped with SIGINT or killed with SIGKILL, a service
killed with SIGKILL mid-turn and started again. Nothing the client saw may be missing from the
transcript afterwards, and a restarted service is used again at once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agentmesh.cli.stack import LocalStack
from agentmesh.config import SERVICES
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc, sessions_pb2
from tests.e2e.conftest import collect, of_kind
from tests.support.llm_server import ScriptedLLMServer, reply, tool_call
from tests.support.local_stack import on_free_ports, start_healthy
from tests.support.processes import children_of, is_running
from tests.support.stack import stack_env
from tests.support.turns import LiveTurn, wait_until

pytestmark = pytest.mark.slow


def process_env(home: Path, llm_base_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a real stack: fixed free ports, so it can be started again on them."""
    return on_free_ports({**os.environ, **stack_env(home, llm_base_url, {"AGENTMESH_DRAIN_S": "5", **(extra or {})})})


class Up:
    """`agentmesh up` as a user runs it, in its own process."""

    def __init__(self, env: dict[str, str], logs: Path):
        self.env = env
        self.out = open(logs, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([sys.executable, "-m", "agentmesh.cli.main", "up", "--logs", "files"],
                                        env=env, stdout=self.out, stderr=subprocess.STDOUT)

    async def healthy(self) -> None:
        # The children's health is what `up` prints once it has seen it; wait for `up`'s own word.
        log = Path(self.out.name)
        await wait_until(lambda: b"agentmesh is up" in log.read_bytes() or self.process.poll() is not None, timeout=90)
        assert self.process.poll() is None, log.read_text()

    async def wait(self, timeout: float = 60) -> int:
        code = await asyncio.to_thread(self.process.wait, timeout)
        self.out.close()
        return code

    def gateway(self):
        return open_channel(self.env["AGENTMESH_GATEWAY_ADDR"])


def shell_turn_script(llm: ScriptedLLMServer, command: str) -> None:
    llm.add(reply("Running it.", tool_call("shell", {"command": command})), reply("All done.", delay_s=0.5))


async def saved_transcript(gateway, session_id: str) -> list:
    reply_ = await gateway.GetTranscript(sessions_pb2.GetTranscriptRequest(session_id=session_id), timeout=30)
    return list(reply_.messages)


def tool_outputs(messages) -> list[str]:
    return [m.content for m in messages if m.role == "tool"]


# --- item 4: stopping `up` ------------------------------------------------------------------


async def test_ctrl_c_on_up_lets_the_turn_finish_and_saves_every_step(tmp_path, llm):
    shell_turn_script(llm, "sleep 1.5; echo finished")
    env = process_env(tmp_path / "home", llm.base_url)
    up = Up(env, tmp_path / "up.log")
    try:
        await up.healthy()
        async with up.gateway() as channel:
            turn = LiveTurn(gateway_pb2_grpc.GatewayStub(channel), "work", "run the job")
            await wait_until(lambda: turn.of_kind("tool_call"))
            up.process.send_signal(signal.SIGINT)  # Ctrl-C while the tool runs
            events = await turn.finished()
        assert "finished" in of_kind(events, "tool_result")[0].result.output
        assert of_kind(events, "run_finished")[0].final_text == "All done.", events
        assert await up.wait() == 0
    finally:
        if up.process.poll() is None:
            up.process.kill()

    # Started again at once on the same ports (only TIME-WAIT sockets are left on them).
    again = Up(env, tmp_path / "up-again.log")
    try:
        await again.healthy()
        async with again.gateway() as channel:
            messages = await saved_transcript(gateway_pb2_grpc.GatewayStub(channel), "work")
        assert any("finished" in output for output in tool_outputs(messages))
        assert messages[-1].role == "assistant" and messages[-1].content == "All done."
    finally:
        again.process.send_signal(signal.SIGTERM)
        assert await again.wait() == 0


async def test_sigkill_of_up_leaves_no_service_running_and_up_starts_again(tmp_path, llm):
    env = process_env(tmp_path / "home", llm.base_url)
    up = Up(env, tmp_path / "up.log")
    await up.healthy()
    services = children_of(up.process.pid)
    assert len(services) == len(SERVICES)

    up.process.kill()
    await up.wait()
    try:
        await wait_until(lambda: not any(is_running(pid) for pid in services))
    finally:  # should the test fail, leave no orphan behind on the machine
        for pid in filter(is_running, services):
            os.kill(pid, signal.SIGKILL)

    again = Up(env, tmp_path / "up-again.log")
    try:
        await again.healthy()
    finally:
        again.process.send_signal(signal.SIGTERM)
        assert await again.wait() == 0


async def test_sighup_of_up_stops_the_stack_like_ctrl_c(tmp_path, llm):
    up = Up(process_env(tmp_path / "home", llm.base_url), tmp_path / "up.log")
    await up.healthy()
    services = children_of(up.process.pid)
    up.process.send_signal(signal.SIGHUP)
    assert await up.wait() == 0
    assert b"stopping" in (tmp_path / "up.log").read_bytes()
    assert not any(is_running(pid) for pid in services)


# --- items 5 and 6: a service killed and started again ----------------------------------------


class Stack:
    """The five services as `agentmesh up` runs them, here so a test can kill and restart one."""

    def __init__(self, tmp_path: Path, llm: ScriptedLLMServer, extra: dict[str, str] | None = None):
        self.local = LocalStack(process_env(tmp_path / "home", llm.base_url, extra), log_dir=tmp_path / "logs")

    async def __aenter__(self) -> "Stack":
        await start_healthy(self.local)
        # A client that waits for the gateway as long as a restart can take on a busy machine.
        self.channel = open_channel(self.local.settings.address_of("gateway"), wait_for_peer_s=30)
        self.gateway = gateway_pb2_grpc.GatewayStub(self.channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.channel.close()
        await asyncio.to_thread(self.local.stop)

    def kill(self, name: str) -> None:
        child = self.local.children[name]
        child.kill()
        child.wait()

    async def restart(self, name: str) -> None:
        self.local.spawn(name)
        await self.local.wait_healthy(names=(name,))

    async def chat(self, session_id: str, message: str, timeout: float = 60) -> list:
        return await collect(self.gateway.Chat(gateway_pb2.ChatRequest(session_id=session_id, message=message),
                                               timeout=timeout))


async def test_memory_gone_at_the_end_of_a_tool_call_fails_the_turn_before_showing_the_result(tmp_path, llm):
    shell_turn_script(llm, "sleep 2; echo finished")
    async with Stack(tmp_path, llm, {"AGENTMESH_AGENT_MEMORY_TIMEOUT_S": "3"}) as stack:
        turn = LiveTurn(stack.gateway, "work", "run the job")
        await wait_until(lambda: turn.of_kind("tool_call"))
        stack.kill("memory")  # the result cannot be saved when the call ends
        events = await turn.finished()

        assert not of_kind(events, "tool_result"), "a result was shown that could not be saved"
        error = of_kind(events, "error")[0]
        assert "could not save the session's transcript" in error.message

        await stack.restart("memory")
        messages = await saved_transcript(stack.gateway, "work")
        shown = [r.result.output for r in of_kind(events, "tool_result")]
        assert all(output in tool_outputs(messages) for output in shown)


async def test_memory_back_within_the_save_deadline_the_turn_completes_and_keeps_the_result(tmp_path, llm):
    shell_turn_script(llm, "sleep 1; echo finished")
    # A save deadline far beyond a restart of memory, however loaded the machine.
    async with Stack(tmp_path, llm, {"AGENTMESH_AGENT_MEMORY_TIMEOUT_S": "150"}) as stack:
        turn = LiveTurn(stack.gateway, "work", "run the job")
        await wait_until(lambda: turn.of_kind("tool_call"))
        stack.kill("memory")
        await asyncio.sleep(2.5)  # the call ends while memory is away
        await stack.restart("memory")  # within the save deadline: the save waits for it
        events = await turn.finished()

        assert of_kind(events, "run_finished")[0].final_text == "All done.", events
        shown = [r.result.output for r in of_kind(events, "tool_result")]
        assert shown and "finished" in shown[0]
        messages = await saved_transcript(stack.gateway, "work")
        assert shown == tool_outputs(messages)


@pytest.mark.parametrize("service", ["memory", "tools", "agent", "gateway"])
async def test_a_turn_started_while_a_service_restarts_waits_for_it_and_succeeds(tmp_path, llm, service):
    llm.add(reply("first", tool_call("shell", {"command": "echo one"})), reply("one done"))
    async with Stack(tmp_path, llm) as stack:
        assert of_kind(await stack.chat("work", "before"), "run_finished")
        stack.kill(service)
        await asyncio.sleep(0.5)  # its callers have seen it go

        llm.add(reply("again", tool_call("shell", {"command": "echo two"})), reply("two done"))
        turn = LiveTurn(stack.gateway, "work", "after")
        await asyncio.sleep(1.5)  # the turn's calls to the service find it away
        await stack.restart(service)
        events = await turn.finished()

        assert of_kind(events, "run_finished") and not of_kind(events, "error"), events
        assert "two" in of_kind(events, "tool_result")[0].result.output
