"""The tools service tells the agent which sessions have background commands (WatchBackground),
so a turn in a session without any makes no BackgroundResults call — and a command's result
still reaches the next turn: on the same agent, on another agent replica, after either side
restarts. Calls counted from the traces (the tools service's SERVER spans), over real gRPC; the
model is the scripted OpenAI-protocol server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agentmesh.internal.v1 import agent_service_pb2, agent_service_pb2_grpc
from agentmesh.rpc.launch import start_service
from tests.agent.test_agent_background import background_notes
from tests.agent.test_agent_finishing import Running, finished, of_kind, run_turn
from tests.agent.test_agent_service import open_session
from tests.support.identities import caller_channel
from tests.support.llm_server import reply, tool_call
from tests.support.timing import polling


def spans(home: Path) -> list[dict]:
    return [json.loads(line) for path in (home / "traces").glob("*.jsonl") for line in path.read_text().splitlines()]


async def served(running, trace_id: str) -> list[str]:
    """The RPCs the tools service served in one turn (from the local span store), once the
    turn's spans are on disk: the agent's RunTurn span ends last, and each service writes its
    spans every 0.2 s."""
    async for _ in polling(0.05):
        if any(s["trace_id"] == trace_id and s["kind"] == "SERVER" and s["service"] == "agentmesh-agent"
               for s in spans(running.home)):
            break
    else:
        raise AssertionError(f"the turn's spans never reached the store (trace {trace_id})")
    await asyncio.sleep(0.5)  # the tools service's own batch
    return [s["name"].rsplit("/", 1)[-1] for s in spans(running.home)
            if s["trace_id"] == trace_id and s["kind"] == "SERVER" and s["service"] == "agentmesh-tools"]


def by_message(script: dict[str, list]):
    """The model's replies per user message (each turn's steps in order); "OK." to any other."""
    def answer(request):
        said = [m["content"] for m in request.messages if m["role"] == "user"][-1]
        queue = script.get(said)
        return queue.pop(0) if queue else reply("OK.")
    return answer


async def turn_on(channel, session_id: str, message: str) -> list:
    request = agent_service_pb2.RunTurnRequest(session_id=session_id, message=message)
    return [e async for e in agent_service_pb2_grpc.AgentStub(channel).RunTurn(iter([request]), timeout=60)]


async def quiet_turns_until_told(turn, sessions: str, running, within_s: float = 15.0) -> None:
    """Quiet turns until one makes no BackgroundResults call: the agent's watch is open (it
    opens as the agent starts, and again after the tools service restarts)."""
    deadline = asyncio.get_running_loop().time() + within_s
    n = 0
    while True:
        n += 1
        events = await turn(f"{sessions}-{n}", "hello")
        if "BackgroundResults" not in await served(running, finished(events).trace_id):
            return
        assert asyncio.get_running_loop().time() < deadline, "the agent never learned which sessions have background state"
        await asyncio.sleep(0.1)


def background_run(command: str):
    return reply("", tool_call("background_run", {"command": command}))


async def test_a_quiet_session_asks_for_no_background_results_and_a_started_commands_result_reaches_the_next_turn(tmp_path):
    script = {"run true": [reply("", tool_call("shell", {"command": "true"})), reply("Done.")],
              "start it": [background_run("sleep 0.3; echo later"), reply("Started it.")],
              "what happened?": [reply("It said later.")]}
    async with Running(tmp_path, by_message(script)) as running:
        await quiet_turns_until_told(lambda s, m: run_turn(running.stack, s, m), "warm", running)
        turns = [await run_turn(running.stack, "s1", "run true"), await run_turn(running.stack, "s1", "start it")]
        turns.append(await run_turn(running.stack, "s2", "anything?"))  # while s1's command runs
        await asyncio.sleep(1.0)  # it has ended
        turns.append(await run_turn(running.stack, "s1", "what happened?"))
        asked = running.llm.requests[-1]
        turns.append(await run_turn(running.stack, "s1", "and now?"))
        calls = [(await served(running, finished(events).trace_id)).count("BackgroundResults") for events in turns]
    # Quiet sessions: no call. The turn that started one: one call, at the step after the one
    # that started it. The next turn of its session: one call, which collects the result; then
    # the session is quiet again.
    assert calls == [0, 1, 0, 1, 0], calls
    assert background_notes(asked) and background_notes(asked)[0].endswith("later")
    assert len(of_kind(turns[3], "background_result")) == 1


async def test_a_command_started_through_one_agent_replica_reaches_the_next_turn_on_another(tmp_path):
    script = {"start it": [background_run("sleep 0.3; echo from-a"), reply("Started.")],
              "what happened?": [reply("It said from-a.")]}
    async with Running(tmp_path, by_message(script)) as running:
        stack = running.stack
        replica_b = await start_service("agent", stack.settings, "127.0.0.1:0")  # the same tools service
        channel_b = caller_channel(stack.settings.keys_dir, "agent", replica_b.target)
        try:
            async def turn_b(session_id, message):
                await open_session(stack, session_id)
                return await turn_on(channel_b, session_id, message)

            await quiet_turns_until_told(turn_b, "warm-b", running)
            started = await run_turn(stack, "shared", "start it")  # through replica A (the stack's agent)
            assert not of_kind(started, "tool_result")[0].result.is_error
            await asyncio.sleep(1.0)
            events = await turn_b("shared", "what happened?")
            asked = running.llm.requests[-1]
        finally:
            await channel_b.close()
            await replica_b.stop(grace=1)
            replica_b.telemetry.shutdown()
    assert background_notes(asked) and background_notes(asked)[0].endswith("from-a")
    assert [b.id for b in of_kind(events, "background_result")] == ["bg-1"]


async def test_after_either_side_restarts_a_started_commands_result_still_reaches_the_next_turn(tmp_path):
    script = {"start one": [background_run("sleep 0.3; echo one"), reply("Started.")],
              "start two": [background_run("sleep 0.3; echo two"), reply("Started.")]}
    async with Running(tmp_path, by_message(script)) as running:
        stack = running.stack

        async def restart(name: str) -> None:
            host = stack.hosts[name]
            await host.stop(grace=1)
            host.telemetry.shutdown()
            stack.hosts[name] = await start_service(name, stack.settings, stack.addresses[name])

        def turn(session_id, message):
            return run_turn(stack, session_id, message)

        await quiet_turns_until_told(turn, "warm", running)
        # The agent restarts while the command runs: its new watch starts from the whole set.
        await run_turn(stack, "r1", "start one")
        await restart("agent")
        await quiet_turns_until_told(turn, "after-agent", running)
        await asyncio.sleep(0.5)
        collected = await run_turn(stack, "r1", "what happened?")
        assert background_notes(running.llm.requests[-1])[0].endswith("one")
        assert len(of_kind(collected, "background_result")) == 1

        # The tools service restarts (its commands end with it); a command started afterwards
        # reaches the next turn, whether or not the watch is back yet.
        await restart("tools")
        await run_turn(stack, "r2", "start two")
        await asyncio.sleep(1.0)
        collected = await run_turn(stack, "r2", "what happened?")
        assert background_notes(running.llm.requests[-1])[0].endswith("two")
        assert len(of_kind(collected, "background_result")) == 1
        # ...and the watch is back: quiet sessions ask for nothing again.
        await quiet_turns_until_told(turn, "after-tools", running)
