"""The test stack (tests/support/stack.py) when another run takes a service's port between its
pick and its bind: every service, including those started before it, is told the port it got —
an agent still pointing at the old gateway port started a team's teammates on another run's
gateway, or on nothing (a loaded full run's `test_teams_no_lead` failure)."""

from __future__ import annotations

import socket

from agentmesh.cli.stack import free_address
from tests.support import stack as stack_module
from tests.support.stack import Stack


async def test_a_port_taken_before_its_service_binds_is_replaced_everywhere(tmp_path, monkeypatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = f"127.0.0.1:{holder.getsockname()[1]}"
    picks = iter([free_address(), free_address(), free_address(), taken])  # the gateway's pick is taken

    monkeypatch.setattr(stack_module, "free_address", lambda: next(picks, None) or free_address())
    try:
        async with Stack(tmp_path / "home", services=("memory", "tools", "agent", "gateway")) as stack:
            assert stack.addresses["gateway"] != taken
            for name, host in stack.hosts.items():
                known = {peer: host.settings.addresses[peer] for peer in stack.services}
                assert known == {peer: stack.addresses[peer] for peer in stack.services}, name
    finally:
        holder.close()
