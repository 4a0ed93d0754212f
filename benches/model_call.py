"""CPU of one model call as the agent service makes it: the OpenAI provider against the scripted
model server, under the call's `chat` span (its `POST` span, the GenAI metrics) with local
tracing on, for a request shaped like the turn bench's — the default catalog's size of tools and
a 50-message history, the turn's two calls.

    python -m benches.model_call [--calls 4] [--rounds 200] [--before-python ../main/.venv/bin/python]

What is measured is the CPU of the calling thread per call (`time.thread_time`), so the model
server, the span exporter's thread and other processes' load count little. `--before-python`
runs the same measurement with another checkout's interpreter (and so its provider and
telemetry), round by round in alternation with this one — short rounds, many of them, so that a
shared machine's load, which changes by the second, falls on both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.agent.loop.model_call import traced_model_call
from agentmesh.agent.providers import build_provider
from agentmesh.agent.settings import AgentSettings
from agentmesh.agent.types import ChatMessage, ModelRequest, ToolCall, ToolSpec, Usage
from agentmesh.config import LLMSettings, Settings
from agentmesh.logs import configure_logging
from agentmesh.telemetry import setup_telemetry

SCHEMA = {"type": "object", "required": ["command"], "properties": {
    "command": {"type": "string", "description": "The command line to run, in the session's workspace."},
    "timeout_s": {"type": "number", "description": "Seconds before the command is stopped."}}}
# ~9 KB of tool JSON, as the default catalog sends.
TOOLS = [ToolSpec(f"tool_{i}", "Runs something in the session's sandboxed workspace and returns its output. " * 3, SCHEMA)
         for i in range(15)]


def turn_requests() -> tuple[ModelRequest, ModelRequest]:
    """A turn's two calls after twelve earlier turns: the same history objects in both."""
    history: list[ChatMessage] = []
    for i in range(12):
        history += [ChatMessage(role="user", content="run true"),
                    ChatMessage(role="assistant", tool_calls=(ToolCall(f"c{i}", "shell", '{"command": "true"}'),)),
                    ChatMessage(role="tool", content="(no output)\n[exit 0]", tool_call_id=f"c{i}", name="shell"),
                    ChatMessage(role="assistant", content="done")]
    user = ChatMessage(role="user", content="run true")
    first = [ChatMessage(role="system", content="You are a helpful agent. " * 35), *history, user]
    call = ToolCall("cx", "shell", '{"command": "true"}')
    second = [ChatMessage(role="system", content="You are a helpful agent. " * 35), *history, user,
              ChatMessage(role="assistant", tool_calls=(call,)),
              ChatMessage(role="tool", content="(no output)\n[exit 0]", tool_call_id="cx", name="shell")]
    return (ModelRequest(model="bench", messages=first, tools=TOOLS, allow_tools=True),
            ModelRequest(model="bench", messages=second, tools=TOOLS, allow_tools=True))


async def measure(base_url: str, calls: int, rounds: int, out) -> None:
    with tempfile.TemporaryDirectory(prefix="agentmesh-model-call-") as home:
        await _measure(home, base_url, calls, rounds, out)


async def _measure(home: str, base_url: str, calls: int, rounds: int, out) -> None:
    """Print one JSON line per round: CPU ms per call."""
    env = {"AGENTMESH_HOME": home, "AGENTMESH_LLM_BASE_URL": base_url,
           "AGENTMESH_LLM_MODEL": "bench", "AGENTMESH_LLM_PROVIDER": "openai", "AGENTMESH_TRACES": "local"}
    configure_logging("agent", "warning")
    telemetry = setup_telemetry("agent", Settings.from_env(env))
    provider, close = build_provider(LLMSettings.from_env(env), AgentSettings.from_env(env), telemetry)
    tracer = telemetry.tracer

    async def turn(requests: tuple[ModelRequest, ModelRequest]) -> None:
        for request in requests:
            with tracer.start_as_current_span("invoke_agent"):
                await traced_model_call(provider, telemetry, request, usage=Usage(), emit=lambda event: None)

    for _ in range(10):
        await turn(turn_requests())
    for _ in range(rounds):
        line = await asyncio.get_running_loop().run_in_executor(None, out.readline) if out else "go"
        if not line:
            break
        # A turn's history is new objects every turn (read from memory); both its calls share it.
        turns = [turn_requests() for _ in range(calls // 2)]
        started = time.thread_time()
        for requests in turns:
            await turn(requests)
        print(json.dumps({"cpu_ms": (time.thread_time() - started) / (len(turns) * 2) * 1000}), flush=True)
    await close()
    telemetry.shutdown()


def _serve_llm(port_out, stop) -> None:
    from tests.support.llm_server import ScriptedLLMServer, reply, tool_call

    def respond(request):
        if request.body["messages"][-1]["role"] == "tool":
            return reply("done", chunk_chars=64)
        return reply("", tool_call("shell", {"command": "true"}), chunk_chars=64)

    with ScriptedLLMServer(default=respond) as llm:
        port_out.put(llm.base_url)
        stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4, help="model calls per round (two per turn)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--before-python", default="", help="also measure with this interpreter (another checkout)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # the model server's URL: measure when told
    args = parser.parse_args()
    if args.child:
        asyncio.run(measure(args.child, args.calls, args.rounds, sys.stdin))
        return
    ctx = multiprocessing.get_context("spawn")
    port_out, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve_llm, args=(port_out, stop), daemon=True)
    server.start()
    base_url = port_out.get(timeout=30)
    root = Path(__file__).resolve().parent.parent
    pythons = {"after": sys.executable, **({"before": args.before_python} if args.before_python else {})}
    children = {name: subprocess.Popen([python, str(Path(__file__).resolve()), "--child", base_url,
                                        "--calls", str(args.calls), "--rounds", str(args.rounds)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)
                for name, python in pythons.items()}
    cpu: dict[str, list[float]] = {name: [] for name in children}
    load_before = os.getloadavg()[0]
    try:
        for r in range(args.rounds):
            names = list(children)
            for name in names[r % len(names):] + names[: r % len(names)]:
                child = children[name]
                child.stdin.write("go\n")
                child.stdin.flush()
                cpu[name].append(json.loads(child.stdout.readline())["cpu_ms"])
    finally:
        for child in children.values():
            child.stdin.close()
            child.wait(30)
        stop.set()
        server.join(5)
    print(f"one model call as the agent makes it (15 tools, 50-message history, chat + POST spans, local tracing); "
          f"{args.calls} calls a round, {args.rounds} alternating rounds\n")
    print("| contender | CPU per call, median | p25 | min |")
    print("| --- | --- | --- | --- |")
    for name in ("before", "after"):
        if name in cpu:
            values = sorted(cpu[name])
            print(f"| {name} | {statistics.median(values):.3f} ms | {values[len(values) // 4]:.3f} ms | {values[0]:.3f} ms |")
    print(f"\nload average {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
