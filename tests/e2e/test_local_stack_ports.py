"""The e2e tests' `agentmesh up` stack (tests/support/local_stack.py) when a port picked for it is
held by another program at its start: it comes up on new ports instead of failing the test."""

from __future__ import annotations

import asyncio
import os
import socket

from agentmesh.cli.stack import LocalStack
from tests.support.local_stack import on_free_ports, start_healthy
from tests.support.stack import stack_env


async def test_a_port_held_by_another_program_is_replaced_and_the_stack_comes_up(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = f"127.0.0.1:{holder.getsockname()[1]}"
    env = {**on_free_ports({**os.environ, **stack_env(tmp_path / "home")}), "AGENTMESH_AGENT_ADDR": taken}
    stack = LocalStack(env, log_dir=tmp_path / "logs")
    try:
        await start_healthy(stack)
        assert stack.settings.address_of("agent") != taken
        assert all(child.poll() is None for child in stack.children.values())
    finally:
        await asyncio.to_thread(stack.stop)
        holder.close()
