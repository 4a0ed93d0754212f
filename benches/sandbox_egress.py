"""What egress costs a call: `shell true` in the default template (no network) beside the same
call in a `network: egress` template (slirp4netns and its routes set up before the program
starts), both in one tools service and one run, in alternating rounds so the machine's load hits
both alike.

    .venv/bin/python -m benches.sandbox_egress [--calls N]

Prints p50/p95 of each and the difference of the p50s: the egress set-up per call.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentmesh.internal.v1 import tools_service_pb2
from benches.sandbox import machine
from benches.session_sandbox import quantile
from tests.tools.support import ToolsClient


async def timed(client: ToolsClient, template: str, i: int, out: list[float]) -> None:
    started = time.perf_counter()
    reply = await client.stub.Execute(tools_service_pb2.ExecuteRequest(
        session_id="bench", call_id=f"c{i}", name="shell", arguments_json=json.dumps({"command": "true"}),
        sandbox_template=template), timeout=120)
    out.append((time.perf_counter() - started) * 1000)
    if reply.result.is_error:
        raise RuntimeError(f"{template or 'default'} failed: {reply.result.output}")


async def main(calls: int, rounds: int = 5) -> int:
    base = Path(tempfile.mkdtemp(prefix="agentmesh-egress-bench-"))
    base.chmod(0o711)
    templates = base / "templates.json"
    templates.write_text(json.dumps({"web": {"network": "egress"}}))
    env = {"AGENTMESH_LOG_LEVEL": "warning", "AGENTMESH_SANDBOX_TEMPLATES": str(templates)}
    async with ToolsClient(base / "home", env) as client:
        print(f"{machine()}; load {os.getloadavg()[0]:.1f}; {datetime.date.today()}; {calls} calls per template, "
              "one at a time, over gRPC")
        samples: dict[str, list[float]] = {"": [], "web": []}
        for template in samples:
            await timed(client, template, -1, [])  # warm-up
        for r in range(rounds):
            for template, out in samples.items():
                for i in range(max(1, calls // rounds)):
                    await timed(client, template, r * calls + i, out)
        none, egress = samples[""], samples["web"]
        print(f"{'template':10} {'p50 ms':>8} {'p95 ms':>8}")
        print(f"{'default':10} {statistics.median(none):8.1f} {quantile(none, 0.95):8.1f}")
        print(f"{'egress':10} {statistics.median(egress):8.1f} {quantile(egress, 0.95):8.1f}")
        print(f"egress set-up per call (p50 difference): {statistics.median(egress) - statistics.median(none):.1f} ms")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100)
    sys.exit(asyncio.run(main(parser.parse_args().calls)))
