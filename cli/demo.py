"""`agentmesh demo`: the main job on embedded defaults, start to finish.

Stack up → one scripted turn that writes and reads a file in the sandbox and saves and
recalls a memory → its events and its trace → stack down. No model server or network needed.

The scripted model narrates as if every step worked, so the demo checks each tool result
itself: at the first failed one it stops the turn (no narration of what did not happen), says
plainly which call failed and why, and exits 1.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass

import grpc

from agentmesh.cli.common import EXIT_OK, EXIT_SERVER_ERROR, call_metadata, load_settings, rpc_failure
from agentmesh.cli.render import HumanRenderer
from agentmesh.cli.stack import LocalStack, free_address, port_is_free
from agentmesh.clients.gateway import GatewayClient
from agentmesh.config import SERVICES, Settings, load
from agentmesh.gateway.settings import GatewaySettings
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc

DEMO_MESSAGE = (
    "Write a short note about agentmesh to notes.txt in your workspace, read it back, "
    "remember that the note exists, then check your memory for it."
)


def register(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="start the stack, run a scripted tool-and-memory task, stop")
    demo.set_defaults(func=run_demo)


def _demo_env() -> dict[str, str]:
    env = os.environ.copy()
    env["AGENTMESH_LLM_PROVIDER"] = "scripted"
    env.pop("AGENTMESH_LLM_SCRIPT", None)  # the built-in demo script
    env.setdefault("AGENTMESH_TRACES", "local")
    # Leave a running `agentmesh up` alone: take free ports for whatever is taken.
    settings = load_settings()
    for name in SERVICES:
        key = f"AGENTMESH_{name.upper()}_ADDR"
        if not port_is_free(settings.address_of(name)):
            env[key] = free_address()
    http = load(GatewaySettings, env).http_address
    if http and not port_is_free(http):
        env["AGENTMESH_GATEWAY_HTTP_ADDR"] = free_address()
    return env


def _show_trace(trace_id: str) -> None:
    try:
        from agentmesh.cli.trace import print_trace
    except ImportError:
        print(f"trace {trace_id}")
        return
    print_trace(trace_id)


@dataclass
class DemoOutcome:
    failure: str = ""  # what went wrong, in a sentence; "" when every step worked
    tool_calls: int = 0
    trace_id: str = ""


async def run_task(stub: gateway_pb2_grpc.GatewayStub, settings: Settings, request: gateway_pb2.ChatRequest,
                   render=None) -> DemoOutcome:
    """Stream the demo turn, showing each event, and stop at the first thing that failed."""
    render = render or HumanRenderer()
    outcome = DemoOutcome()
    call = stub.Chat(request, metadata=call_metadata(settings))
    try:
        async for event in call:
            kind = event.WhichOneof("payload")
            render(event)
            if kind == "tool_result":
                result = event.tool_result.result
                outcome.tool_calls += 1
                if result.is_error:
                    outcome.failure = f"the `{result.name}` call failed: {result.output.strip()}"
            elif kind == "error":
                outcome.failure = f"the turn failed ({event.error.code}): {event.error.message}"
            elif kind == "run_finished":
                outcome.trace_id = event.run_finished.trace_id
                if event.run_finished.stop_reason not in ("", "completed"):
                    outcome.failure = f"the turn ended early ({event.run_finished.stop_reason})"
            if outcome.failure:
                call.cancel()  # the rest of the script would narrate a success that did not happen
                break
    except grpc.aio.AioRpcError as err:
        raise rpc_failure(err, "gateway", settings) from None
    if not outcome.failure and not outcome.trace_id:
        outcome.failure = "the turn ended without finishing"
    return outcome


async def run_demo(args) -> int:
    env = _demo_env()
    stack = LocalStack(env, log_dir=load_settings().home / "logs")
    settings = stack.settings
    print(f"· starting the five services (logs in {stack.log_dir})")
    started = time.monotonic()
    stack.start()
    try:
        await stack.wait_healthy()
        print(f"· stack healthy in {time.monotonic() - started:.1f}s; running the demo task")
        if stack.console_url:
            print(f"· web console: {stack.console_url} (open it while the stack runs: `agentmesh up`)")
        print()
        print(f"you> {DEMO_MESSAGE}\n")
        async with open_channel(settings.address_of("gateway")) as channel:
            request = gateway_pb2.ChatRequest(session_id=f"demo-{int(time.time())}", message=DEMO_MESSAGE)
            outcome = await run_task(GatewayClient(channel).stub, settings, request)
        if outcome.failure:
            print(f"\n✗ the demo did not complete: {outcome.failure}")
            print(f"  the services' logs are in {stack.log_dir}")
            return EXIT_SERVER_ERROR
        print(f"\n✓ the demo completed: {outcome.tool_calls} tool calls, each one succeeded")
        if outcome.trace_id:
            await asyncio.sleep(0.5)  # let the services' span exporters flush
            print()
            _show_trace(outcome.trace_id)
        return EXIT_OK
    finally:
        print("\n· stopping the stack")
        await asyncio.to_thread(stack.stop)
        sys.stdout.flush()
