"""Helpers for the tools tests: a tools service on a real port, and looking for stray processes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Mapping

from agentmesh.config import Settings
from agentmesh.internal.v1 import tools_service_pb2, tools_service_pb2_grpc
from agentmesh.rpc.launch import start_service
from tests.support.identities import signed_channel
from tests.support.timing import PATIENCE_S


def tools_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        "AGENTMESH_HOME": str(home),
        "AGENTMESH_TRACES": "none",
        "AGENTMESH_DRAIN_S": "1",
        # A secret the sandboxed programs must never see.
        "AGENTMESH_LLM_API_KEY": "sk-test-secret-key-0123456789",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "AGENTMESH_TOOLS_DEFAULT_TIMEOUT_S": "20",
    }
    env.update(extra or {})
    return env


class ToolsClient:
    """A tools service on 127.0.0.1:0 and a stub to it."""

    def __init__(self, home: Path, env: Mapping[str, str] | None = None):
        self.home = Path(home)
        self.env = tools_env(self.home, env)
        self.host = None
        self.channel = None
        self.stub: tools_service_pb2_grpc.ToolsStub | None = None

    async def __aenter__(self) -> "ToolsClient":
        self.host = await start_service("tools", Settings.from_env(self.env), "127.0.0.1:0")
        # The tools service takes Execute from the agent: this client signs as the agent.
        self.channel = signed_channel(Settings.from_env(self.env).keys_dir, "agent", "tools", self.host.target)
        self.stub = tools_service_pb2_grpc.ToolsStub(self.channel)
        # DeleteWorkspace is the gateway's to call.
        self.gateway_channel = signed_channel(Settings.from_env(self.env).keys_dir, "gateway", "tools", self.host.target)
        self.as_gateway = tools_service_pb2_grpc.ToolsStub(self.gateway_channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.channel.close()
        await self.gateway_channel.close()
        await self.host.stop(grace=1)
        self.host.telemetry.shutdown()

    def workspace(self, session_id: str) -> Path:
        return self.home / "workspaces" / session_id

    async def call(self, name: str, arguments: Any, session_id: str = "s1", call_id: str = "c1", timeout_s: float = 0):
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        reply = await self.stub.Execute(
            tools_service_pb2.ExecuteRequest(session_id=session_id, call_id=call_id, name=name, arguments_json=text, timeout_s=timeout_s),
            timeout=120,
        )
        return reply.result


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (our own test process excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry))
    return found


def describe(pids: list[int]) -> str:
    """For a failure message: what the stray processes are."""
    out = []
    for pid in pids:
        try:
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace")[:120]
            out.append(f"{pid} ppid={status.get('PPid')} state={status.get('State')} uid={status.get('Uid')} nspid={status.get('NSpid')} {cmd}")
        except OSError:
            out.append(f"{pid} (gone)")
    return "\n".join(out)


async def wait_until(predicate, timeout_s: float = PATIENCE_S, interval_s: float = 0.05) -> bool:
    """Poll `predicate` until it is true or the bound passes (a liveness bound, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval_s)
    return predicate()
