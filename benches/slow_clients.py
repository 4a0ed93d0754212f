"""Idle slow HTTP clients against a running gateway: what they cost it, and that they all go.

The five services run as `agentmesh up` runs them (separate processes). `--clients` loopback
connections each send the start of a request head and then one more byte every `--pace-s`
seconds (a slowloris client; no credentials are needed to send a head). The gateway's resident
memory and open file descriptors are read from /proc before, at the peak with every client
connected, and after; then each client waits for the gateway to close its connection and notes
what it was told (408 and the setting's name) and when. Every loop is bounded: a client sends
at most a few times the header timeout's worth of bytes, and the wait for the closes is bounded.

The per-address cap is turned off for the run (every client is 127.0.0.1; the default cap of
256 would refuse most of them at once — what tests/gateway/test_slow_clients.py checks).

    python -m benches.slow_clients [--clients 1000] [--header-timeout-s 10] [--pace-s 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.cli.stack import LocalStack, free_address
from agentmesh.config import SERVICES

HEAD = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def start_stack(home: Path, header_timeout_s: float) -> LocalStack:
    env = {**os.environ, "AGENTMESH_HOME": str(home), "AGENTMESH_LLM_PROVIDER": "scripted",
           "AGENTMESH_LOG_LEVEL": "warning", "AGENTMESH_GATEWAY_HTTP_HEADER_TIMEOUT_S": str(header_timeout_s),
           "AGENTMESH_GATEWAY_HTTP_MAX_CONNECTIONS_PER_IP": "0"}
    env.update({f"AGENTMESH_{name.upper()}_ADDR": free_address() for name in SERVICES})
    env["AGENTMESH_GATEWAY_HTTP_ADDR"] = free_address()
    stack = LocalStack(env, log_dir=home / "logs")
    stack.start()
    return stack


class SlowClient:
    def __init__(self, host: str, port: int, pace_s: float, max_bytes: int):
        self.host, self.port, self.pace_s, self.max_bytes = host, port, pace_s, max_bytes
        self.opened = 0.0
        self.closed_after_s: float | None = None
        self.answer = b""

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.opened = time.monotonic()
        self.writer.write(HEAD)

    async def trickle(self) -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(self.max_bytes):  # bounded: the server should have closed long before
                await asyncio.sleep(self.pace_s)
                if self.closed_after_s is not None:
                    return
                self.writer.write(b"a")
                await self.writer.drain()

    async def wait_closed(self) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await self.reader.read(65536):
                self.answer += chunk
        self.closed_after_s = time.monotonic() - self.opened
        self.writer.close()


async def run(clients: int, header_timeout_s: float, pace_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp) / "home", header_timeout_s)
        try:
            await stack.wait_healthy()
            pid = stack.children["gateway"].pid
            host, _, port = load_http_address(stack).rpartition(":")
            await asyncio.sleep(1.0)  # the gateway settles after start-up
            before = {"rss_mb": round(rss_mb(pid), 1), "fds": fds(pid)}
            max_bytes = int(4 * header_timeout_s / pace_s) + 4
            slow = [SlowClient(host, int(port), pace_s, max_bytes) for _ in range(clients)]
            started = time.monotonic()
            for start in range(0, clients, 100):  # connect in batches, as a crowd would arrive
                await asyncio.gather(*(c.open() for c in slow[start:start + 100]))
            opened_in_s = time.monotonic() - started
            tasks = [asyncio.create_task(c.trickle()) for c in slow] + [asyncio.create_task(c.wait_closed()) for c in slow]
            peak = dict(before)
            deadline = time.monotonic() + 4 * header_timeout_s + 30
            while time.monotonic() < deadline and any(c.closed_after_s is None for c in slow):
                peak = {"rss_mb": max(peak["rss_mb"], round(rss_mb(pid), 1)), "fds": max(peak["fds"], fds(pid))}
                await asyncio.sleep(0.25)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(1.0)
            after = {"rss_mb": round(rss_mb(pid), 1), "fds": fds(pid)}
        finally:
            stack.stop()
    closes = sorted(c.closed_after_s for c in slow if c.closed_after_s is not None)
    told = sum(1 for c in slow if c.answer.startswith(b"HTTP/1.1 408 ") and b"HEADER_TIMEOUT_S" in c.answer)
    return {
        "clients": clients, "header_timeout_s": header_timeout_s, "pace_s": pace_s,
        "connected_in_s": round(opened_in_s, 2),
        "gateway_before": before, "gateway_peak_with_clients_open": peak, "gateway_after": after,
        "per_client": {"rss_kib": round((peak["rss_mb"] - before["rss_mb"]) * 1024 / clients, 1),
                       "fds": round((peak["fds"] - before["fds"]) / clients, 2)},
        "closed_by_gateway": len(closes), "told_408": told, "still_open": clients - len(closes),
        "closed_after_s": {"min": round(closes[0], 2), "median": round(statistics.median(closes), 2),
                           "max": round(closes[-1], 2)} if closes else None,
    }


def load_http_address(stack: LocalStack) -> str:
    return stack.env["AGENTMESH_GATEWAY_HTTP_ADDR"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--header-timeout-s", type=float, default=10.0)
    parser.add_argument("--pace-s", type=float, default=2.0)
    args = parser.parse_args()
    result = asyncio.run(run(args.clients, args.header_timeout_s, args.pace_s))
    print(json.dumps(result, indent=2))
    return 0 if result["still_open"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
