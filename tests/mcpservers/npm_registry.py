"""A local npm registry stand-in (the packument and tarball routes npm uses) serving one package:
an MCP stdio server in plain Node (no dependencies) whose bin `npx -y agentmesh-test-mcp` runs."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["NAME", "NpmRegistry"]

NAME = "agentmesh-test-mcp"
VERSION = "1.0.0"

SERVER_JS = r"""#!/usr/bin/env node
const readline = require("readline");
const send = (m) => process.stdout.write(JSON.stringify(m) + "\n");
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const m = JSON.parse(line);
  if (m.id === undefined) return;
  if (m.method === "initialize") {
    send({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: "npm-echo", version: "1.0.0" } } });
  } else if (m.method === "tools/list") {
    send({ jsonrpc: "2.0", id: m.id, result: { tools: [{ name: "echo", description: "Say the text back",
      inputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] } }] } });
  } else if (m.method === "tools/call") {
    send({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: "npm says " + m.params.arguments.text }] } });
  } else {
    send({ jsonrpc: "2.0", id: m.id, result: {} });
  }
});
"""


def _manifest(scripts: dict[str, str]) -> dict:
    manifest = {"name": NAME, "version": VERSION, "bin": {NAME: "server.js"}}
    return {**manifest, "scripts": scripts} if scripts else manifest


def _tarball(scripts: dict[str, str]) -> bytes:
    files = {"package/package.json": json.dumps(_manifest(scripts)), "package/server.js": SERVER_JS}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class NpmRegistry:
    """`with NpmRegistry() as registry:` serves on 127.0.0.1 (or `host`); `requests` counts what was asked.
    `scripts`: the package's npm scripts (a `postinstall` runs in the install, as npm runs them)."""

    def __init__(self, host: str = "127.0.0.1", scripts: dict[str, str] | None = None):
        self.scripts = dict(scripts or {})
        self.tarball = _tarball(self.scripts)
        self.requests: list[str] = []
        # Cleared: the tarball is held back until it is set again (a slow download).
        self.gate = threading.Event()
        self.gate.set()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                registry.requests.append(self.path)
                if self.path.endswith(".tgz"):
                    registry.gate.wait(120)
                    body, kind = registry.tarball, "application/octet-stream"
                elif self.path.strip("/") == NAME:
                    body, kind = json.dumps(registry.packument()).encode(), "application/json"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self._server.server_address[1]}/"

    def packument(self) -> dict:
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(self.tarball).digest()).decode()
        dist = {"tarball": f"{self.url}{NAME}/-/{NAME}-{VERSION}.tgz", "integrity": integrity,
                "shasum": hashlib.sha1(self.tarball).hexdigest()}
        return {"name": NAME, "dist-tags": {"latest": VERSION},
                "versions": {VERSION: {**_manifest(self.scripts), "dist": dist,
                                       **({"hasInstallScript": True} if self.scripts else {})}}}

    def __enter__(self) -> "NpmRegistry":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
