"""Watching and attaching over real gRPC (and HTTP): `WatchActivity` shows every running turn's
tool calls as they happen; `AttachTurn` joins a session's running turn and follows it to its end,
with the same events its own client gets."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import grpc
import httpx
import pytest

from agentmesh.v1 import gateway_pb2
from tests.e2e.conftest import rpc_error
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.turns import LiveTurn, collect, kinds, wait_until

APPROVAL = {"AGENTMESH_AGENT_APPROVAL_TOOLS": "shell"}


@pytest.fixture
async def stack(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=APPROVAL) as running:
        yield running


class Watch:
    def __init__(self, gateway, metadata=(), **fields):
        self.call = gateway.WatchActivity(gateway_pb2.WatchActivityRequest(**fields), timeout=60, metadata=metadata)
        self.items: list = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for item in self.call:
            self.items.append(item)

    def kinds(self) -> list:
        return [(a.session_id, a.WhichOneof("payload")) for a in self.items if a.WhichOneof("payload")]

    async def live(self, replicas: int = 1) -> None:
        await wait_until(lambda: sum(1 for a in self.items if a.WhichOneof("payload") is None) >= replicas)

    def stop(self) -> None:
        self.call.cancel()


async def test_watch_shows_tool_calls_of_every_session_and_attach_follows_a_turn_to_its_end(stack, llm):
    gateway = stack.gateway_stub()
    watch, only_b = Watch(gateway), Watch(gateway, session_ids=["b"])
    await watch.live()
    await only_b.live()

    # Session a holds a shell call for approval: its turn is running while we attach.
    llm.add(reply("Checking.", tool_call("shell", {"command": "echo attached"}, id="c1")), reply("All done."))
    first = LiveTurn(gateway, "a", "run the echo")
    await first.approval_request()

    attached = asyncio.create_task(collect(gateway.AttachTurn(gateway_pb2.AttachTurnRequest(session_id="a"), timeout=30)))
    late = asyncio.create_task(collect(gateway.AttachTurn(
        gateway_pb2.AttachTurnRequest(session_id="a", after_seq=first.events[-1].seq), timeout=30)))
    await asyncio.sleep(0.2)
    assert not attached.done()  # it follows: the turn has not ended
    await gateway.Approve(gateway_pb2.ApproveRequest(session_id="a", call_id="c1", approved=True), timeout=10)
    own = await first.finished()
    followed, after = await attached, await late

    # Attached from the start: exactly the events the turn's own client got, in order, to the end.
    assert followed == own
    assert kinds(after)[0] == "approval_resolved" and after == own[len(own) - len(after):]

    llm.add(reply("b here"))
    await collect(gateway.Chat(gateway_pb2.ChatRequest(session_id="b", message="hi"), timeout=30))
    await wait_until(lambda: ("b", "run_finished") in watch.kinds() and ("b", "run_finished") in only_b.kinds())
    watch.stop(), only_b.stop()
    assert watch.kinds() == [("a", "run_started"), ("a", "tool_call"), ("a", "approval_request"), ("a", "tool_result"),
                             ("a", "run_finished"), ("b", "run_started"), ("b", "run_finished")]
    assert only_b.kinds() == [("b", "run_started"), ("b", "run_finished")]
    call = next(a for a in watch.items if a.WhichOneof("payload") == "tool_call")
    result = next(a for a in watch.items if a.WhichOneof("payload") == "tool_result")
    assert json.loads(call.tool_call.arguments_json) == {"command": "echo attached"}
    assert "attached" in result.tool_result.result.output and call.run_id == own[0].run_id


async def test_attaching_to_a_session_without_a_running_turn_is_not_found(stack):
    gateway = stack.gateway_stub()
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="idle"), timeout=10)
    err = await rpc_error(collect(gateway.AttachTurn(gateway_pb2.AttachTurnRequest(session_id="idle"))))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details() == "session 'idle' has no turn running now; its transcript has what earlier turns did"
    err = await rpc_error(collect(gateway.AttachTurn(gateway_pb2.AttachTurnRequest(session_id="ghost"))))
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details() == "session 'ghost' does not exist"
    err = await rpc_error(collect(stack.gateway_stub().AttachTurn(gateway_pb2.AttachTurnRequest(session_id="../x"))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def cli_process(stack, *args: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTMESH_")}
    env.update(stack.env)
    env.update({f"AGENTMESH_{name.upper()}_ADDR": addr for name, addr in stack.addresses.items()})
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "agentmesh.cli.main", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def test_activity_and_attach_over_http_and_the_cli(stack, llm):
    gateway = stack.gateway_stub()
    llm.add(reply("", tool_call("shell", {"command": "echo over-http"}, id="c2")), reply("fine"))
    first = LiveTurn(gateway, "h", "go")
    await first.approval_request()
    async with httpx.AsyncClient(base_url=stack.http_url, timeout=30) as http:
        async with http.stream("GET", "/v1/sessions/h/turn") as response:
            assert response.status_code == 200
            cli = await cli_process(stack, "chat", "--attach", "h")
            # Attached once it has printed the turn's start (replayed from the running turn).
            head = await asyncio.wait_for(cli.stdout.readline(), 60)
            assert head.decode().startswith(f"· run {first.events[0].run_id} on session h"), head
            await gateway.Approve(gateway_pb2.ApproveRequest(session_id="h", call_id="c2", approved=True), timeout=10)
            body = (await response.aread()).decode()
        assert "event: run_started" in body and "event: run_finished" in body and "over-http" in body
        missing = await http.get("/v1/sessions/nobody/turn")
        assert missing.status_code == 404
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0, err.decode()
    out = head.decode() + out.decode()
    assert "← shell" in out and "over-http" in out and out.rstrip().endswith(f"trace {first.events[0].run_started.trace_id}")


async def test_a_watch_ends_when_the_gateway_drains(tmp_path, llm):
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url) as stack:
        watch = Watch(stack.gateway_stub())
        await watch.live()
        loop = asyncio.get_running_loop()
        started = loop.time()
        gateway = stack.hosts.pop("gateway")
        await gateway.stop(grace=30)
        gateway.telemetry.shutdown()
        # The watch ended at once, cleanly, rather than holding the gateway for its 30 s grace.
        await asyncio.wait_for(watch.task, 5)
        assert loop.time() - started < 10
