"""What oversized requests cost the gateway, and what a service token costs a call.

    python -m benches.request_bounds

1. A real gateway (`agentmesh serve gateway`, its own process) receives 100 Chat requests of
   15 MB each and refuses them all; its resident memory (VmRSS) is read before and after.
   Default: the receive cap sized to the API (1 MiB). Baseline, in the same run: the same
   gateway with AGENTMESH_GATEWAY_MAX_MESSAGE_CHARS=4000000, which lifts the cap to ~16 MB as
   it was before — each request is then read whole and refused by validation instead.
2. Signing and checking one service token (Ed25519 / EdDSA via PyJWT), per call.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.v1 import gateway_pb2, gateway_pb2_grpc

REQUESTS = 100
REQUEST_BYTES = 15 * 1024 * 1024


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def refused_requests(extra_env: dict[str, str]) -> tuple[float, float, str]:
    """RSS (MiB) of a gateway before and after REQUESTS refused oversized Chats, and the status."""
    with tempfile.TemporaryDirectory() as home:
        address = _free_address()
        env = {**os.environ, "AGENTMESH_HOME": home, "AGENTMESH_GATEWAY_ADDR": address, "AGENTMESH_TRACES": "none",
               "AGENTMESH_LOG_LEVEL": "error", "AGENTMESH_GATEWAY_HTTP_ADDR": "off", **extra_env}
        child = subprocess.Popen([sys.executable, "-m", "agentmesh.cli.main", "serve", "gateway"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
            async with grpc.aio.insecure_channel(address, options=options) as channel:
                await asyncio.wait_for(channel.channel_ready(), 30)
                stub = gateway_pb2_grpc.GatewayStub(channel)
                before = rss_mib(child.pid)
                request = gateway_pb2.ChatRequest(session_id="s", message="x" * REQUEST_BYTES)
                codes: set[str] = set()
                for _ in range(REQUESTS):
                    try:
                        async for _event in stub.Chat(request, timeout=30):
                            pass
                    except grpc.aio.AioRpcError as err:
                        codes.add(err.code().name)
                await asyncio.sleep(1)
                return before, rss_mib(child.pid), ",".join(sorted(codes)) or "accepted?"
        finally:
            child.terminate()
            child.wait(30)


def token_cost_us(rounds: int = 2000) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as keys:
        agent = ServiceIdentity.open("agent", Path(keys))
        memory = ServiceIdentity.open("memory", Path(keys))
        token = agent.sign("memory")
        memory.verify(token)  # loads the key once
        started = time.perf_counter()
        for _ in range(rounds):
            token = agent.sign("memory")
        signed = time.perf_counter()
        for _ in range(rounds):
            memory._verify(token)  # noqa: SLF001 - the full check, as without the cache
        verified = time.perf_counter()
        for _ in range(rounds):
            memory.verify(agent.token("memory"))  # what a call costs with both caches warm
        cached = time.perf_counter()
    print(f"with the token caches (reused token, remembered check): {(cached - verified) / rounds * 1e6:.1f} µs per call")
    return (signed - started) / rounds * 1e6, (verified - signed) / rounds * 1e6


async def main() -> None:
    print(f"{REQUESTS} refused Chat requests of {REQUEST_BYTES // (1024 * 1024)} MB each, gateway VmRSS")
    print(f"{'receive cap':<34} {'status':<20} {'RSS before':>11} {'RSS after':>10}")
    for label, env in (("16.3 MiB (baseline: 4M chars)", {"AGENTMESH_GATEWAY_MAX_MESSAGE_CHARS": "4000000"}),
                       ("1 MiB (default, 100k chars)", {})):
        before, after, codes = await refused_requests(env)
        print(f"{label:<34} {codes:<20} {before:>8.0f} MiB {after:>6.0f} MiB")
    sign_us, verify_us = token_cost_us()
    print(f"\nservice token per call: sign {sign_us:.0f} µs, verify {verify_us:.0f} µs (EdDSA, PyJWT)")


if __name__ == "__main__":
    asyncio.run(main())
