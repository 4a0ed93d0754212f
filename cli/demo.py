"""`agentmesh demo`: the main job on embedded defaults, start to finish.

Stack up → one scripted turn that writes and reads a file in the sandbox and saves and
recalls a memory → its events and its trace → stack down. No model server or network needed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from agentmesh.cli.chat import HumanRenderer, stream_turn
from agentmesh.cli.common import EXIT_OK, load_settings
from agentmesh.cli.stack import LocalStack, free_address, port_is_free
from agentmesh.config import SERVICES
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
    http = GatewaySettings.from_env(env).http_address
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
        trace_ids: list[str] = []

        render = HumanRenderer()

        def on_event(event) -> None:
            render(event)
            if event.WhichOneof("payload") == "run_finished":
                trace_ids.append(event.run_finished.trace_id)

        async with open_channel(settings.address_of("gateway")) as channel:
            request = gateway_pb2.ChatRequest(session_id=f"demo-{int(time.time())}", message=DEMO_MESSAGE)
            code = await stream_turn(gateway_pb2_grpc.GatewayStub(channel), settings, request, on_event)
        if trace_ids and trace_ids[0]:
            await asyncio.sleep(0.5)  # let the services' span exporters flush
            print()
            _show_trace(trace_ids[0])
        return code
    finally:
        print("\n· stopping the stack")
        await asyncio.to_thread(stack.stop)
        sys.stdout.flush()

