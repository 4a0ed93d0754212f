"""An embedded memory service (Qdrant Edge under AGENTMESH_HOME, the default) does not import
qdrant-client, the Qdrant server's client: it costs about a second of CPU at every start of the
service (each `agentmesh up` and `agentmesh serve memory`) and is needed only when
AGENTMESH_QDRANT_URL names a server or a local-mode home is migrated (services/memory/stores.py)."""

from __future__ import annotations

import subprocess
import sys

# Builds and starts the service on a fresh home, as `agentmesh serve memory` does, then names every
# module the process imported.
PROBE = """
import asyncio, sys, tempfile
from agentmesh.config import Settings
from agentmesh.rpc.launch import start_service

async def main(home):
    host = await start_service("memory", Settings.from_env({"AGENTMESH_HOME": home, "AGENTMESH_TRACES": "none"}),
                               "127.0.0.1:0")
    await host.stop(grace=0)

with tempfile.TemporaryDirectory() as home:
    asyncio.run(main(home))
print(" ".join(sorted(sys.modules)))
"""


def test_an_embedded_memory_service_starts_without_the_qdrant_server_client():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    modules = set(result.stdout.split())
    assert "agentmesh.memory.edge_store" in modules, "the probe did not start the embedded store"
    assert sorted(m for m in modules if m == "qdrant_client" or m.startswith("qdrant_client.")) == []
