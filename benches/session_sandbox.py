"""A call in a session sandbox beside a call in a fresh per-call jail, both measured in one run.

    .venv/bin/python -m benches.session_sandbox [--calls N]

Two tools services on this machine, one with AGENTMESH_SANDBOX_ISOLATION=call (the default),
one with =session; each gets `shell` calls of `true` (and `python` calls of `print(1)`) over
gRPC, one at a time, for one session, in alternating rounds so a change in the machine's load
hits both alike. The first call of the session (the session jail's start) is a warm-up and not
counted: what is measured is a later call, which is what a session's calls mostly are.
Prints p50/p95 of each and the ratio session / call.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.logs import configure_logging
from benches.sandbox import machine
from tests.tools.support import ToolsClient

CASES = {
    "shell true": ("shell", {"command": "true"}),
    "python print(1)": ("python", {"code": "print(1)"}),
}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def timed(client: ToolsClient, name: str, args: dict, i: int, out: list[float]) -> None:
    started = time.perf_counter()
    result = await client.call(name, args, session_id="bench", call_id=f"c{i}")
    out.append((time.perf_counter() - started) * 1000)
    if result.is_error:
        raise RuntimeError(f"{name} failed: {result.output}")


async def main(calls: int, rounds: int = 5) -> int:
    base = Path(tempfile.mkdtemp(prefix="agentmesh-session-bench-"))
    base.chmod(0o711)
    # The services run in this process, where nothing configures logging from their settings: a
    # line per call rendered to the terminal would be counted into both modes' calls.
    configure_logging("bench", "warning")
    quiet = {"AGENTMESH_LOG_LEVEL": "warning"}
    async with ToolsClient(base / "call", {**quiet, "AGENTMESH_SANDBOX_ISOLATION": "call"}) as per_call, \
            ToolsClient(base / "session", {**quiet, "AGENTMESH_SANDBOX_ISOLATION": "session"}) as session:
        print(f"{machine()}; {datetime.date.today()}; {calls} calls per case and mode, one at a time, over gRPC")
        print(f"{'case':18} {'call p50':>9} {'call p95':>9} {'session p50':>12} {'session p95':>12} {'ratio p50':>10}")
        for label, (name, args) in CASES.items():
            samples: dict[str, list[float]] = {"call": [], "session": []}
            for client in (per_call, session):
                await timed(client, name, args, -1, [])  # warm-up: the session's jail starts here
            for r in range(rounds):
                for mode, client in (("call", per_call), ("session", session)):
                    for i in range(max(1, calls // rounds)):
                        await timed(client, name, args, r * calls + i, samples[mode])
            c, s = samples["call"], samples["session"]
            ratio = statistics.median(s) / statistics.median(c)
            print(f"{label:18} {statistics.median(c):8.2f}  {quantile(c, 0.95):8.2f}  {statistics.median(s):11.2f}  "
                  f"{quantile(s, 0.95):11.2f}  {ratio:9.2f}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    sys.exit(asyncio.run(main(parser.parse_args().calls)))
