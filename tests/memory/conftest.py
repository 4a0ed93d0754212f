"""The memory service on a real port, over real gRPC, on a fresh AGENTMESH_HOME per test.

async def test_x(memory_service):
    client = memory_service.client          # agentmesh.clients.memory.MemoryClient
    stub = memory_service.stub              # the raw Memory stub, for status codes
    await memory_service.restart()          # stop, then start again on the same home

async def test_y(carrying):                 # an agent's MemoryClient whose calls ride its stream
    await carrying.client.append_messages(...); carrying.made  # the methods its channel called
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Mapping

import pytest

from agentmesh.clients.memory import MemoryClient
from agentmesh.config import Settings
from agentmesh.rpc.identity import ServiceIdentity
from agentmesh.rpc.launch import start_service
from agentmesh.rpc.server import ServiceHost
from tests.memory.store_adapters import store_factory  # noqa: F401 - every adapter, for the port suites
from tests.memory.test_document_port import documents_factory  # noqa: F401 - both document adapters (test_agent_port.py)
from tests.support.identities import signed_channel
from tests.support.recording import recording_channel


class MemoryService:
    def __init__(self, home: Path, env: Mapping[str, str] | None = None):
        self.env = {"AGENTMESH_HOME": str(home), "AGENTMESH_TRACES": "local", "AGENTMESH_DRAIN_S": "1", **(env or {})}
        self.host: ServiceHost | None = None
        self._channel = None
        self.client: MemoryClient
        self.stub = None

    async def start(self) -> "MemoryService":
        self.host = await start_service("memory", Settings.from_env(self.env), "127.0.0.1:0")
        # Transcripts take writes from the agent only: these tests sign as the agent.
        self._channel = signed_channel(Settings.from_env(self.env).keys_dir, "agent", "memory", self.host.target)
        self.client = MemoryClient(self._channel, target=self.host.target)
        self.stub = self.client.stub
        return self

    async def stop(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self.host is not None:
            await self.host.stop(grace=1)
            self.host.telemetry.shutdown()
            self.host = None

    async def restart(self, env: Mapping[str, str] | None = None) -> None:
        await self.stop()
        self.env.update(env or {})
        await self.start()


@pytest.fixture
async def memory_service(tmp_path):
    service = await MemoryService(tmp_path / "home").start()
    try:
        yield service
    finally:
        await service.stop()


@pytest.fixture
async def make_memory_service(tmp_path):
    """Start services with a custom environment: `await make_memory_service({...})`."""
    started: list[MemoryService] = []

    async def make(env: Mapping[str, str] | None = None, home: Path | None = None) -> MemoryService:
        service = await MemoryService(home or tmp_path / "home", env).start()
        started.append(service)
        return service

    try:
        yield make
    finally:
        for service in started:
            await service.stop()


class ConceptEmbeddings:
    """A real OpenAI-compatible `/embeddings` server with a tiny model of meaning.

    Words of one concept share a dimension ("car" and "automobile" point the same way), so a
    query can match a memory with no word in common - what a dense model adds over BM25.
    Set `dim` to change the size of the vectors it answers with mid-test.
    """

    CONCEPTS: ClassVar[list[set[str]]] = [
        {"car", "automobile", "vehicle", "truck", "sedan"},
        {"tea", "coffee", "drink", "beverage", "espresso"},
        {"dog", "cat", "puppy", "pet", "kitten"},
        {"guitar", "piano", "music", "song", "violin"},
        {"doctor", "hospital", "medicine", "nurse", "clinic"},
    ]

    def __init__(self, dim: int = 16):
        self.dim = dim
        self.requests = 0
        self._server = None

    def embed(self, text: str) -> list[float]:
        import math
        import re
        import zlib

        vector = [0.0] * self.dim
        for word in re.findall(r"[a-z]+", text.lower()):
            for i, concept in enumerate(self.CONCEPTS):
                if word in concept:
                    vector[i] += 1.0
                    break
            else:
                vector[len(self.CONCEPTS) + zlib.crc32(word.encode()) % (self.dim - len(self.CONCEPTS))] += 0.3
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        return [v / norm for v in vector]

    def __enter__(self) -> "ConceptEmbeddings":
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers do

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                if self.path != "/v1/embeddings":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                data = [{"object": "embedding", "index": i, "embedding": outer.embed(t)} for i, t in enumerate(inputs)]
                payload = json.dumps({"object": "list", "data": data, "model": body.get("model", "")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def concept_embeddings():
    with ConceptEmbeddings() as server:
        yield server


@pytest.fixture(params=["per-namespace", "shared"])
async def any_layout_service(request, tmp_path):
    """The service with each memory layout (embedded defaults to per-namespace; servers to shared)."""
    service = await MemoryService(tmp_path / "home", {"AGENTMESH_MEMORY_LAYOUT": request.param}).start()
    try:
        yield service
    finally:
        await service.stop()


class Carrying:
    """A MemoryClient signed as `caller` that carries its calls on a stream (as the agent's does),
    on a channel of its own that records the methods it calls (`made`)."""

    def __init__(self, service: MemoryService, caller: str = "agent"):
        keys = Settings.from_env(service.env).keys_dir
        self.channel, self.made = recording_channel(keys, caller, "memory", service.host.target)
        self.client = MemoryClient(self.channel, target=service.host.target, timeout_s=5,
                                   carry=(ServiceIdentity.open(caller, keys), None))

    async def close(self) -> None:
        await self.client.close()
        await self.channel.close()


@pytest.fixture
async def carrying(memory_service):
    agent = Carrying(memory_service)
    try:
        yield agent
    finally:
        await agent.close()
