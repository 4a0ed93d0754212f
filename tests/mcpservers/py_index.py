"""A local Python package index stand-in (PEP 503's simple API, as uv and pip read it) serving the
wheels of a directory: the published `mcp-server-time` and its dependencies, downloaded from PyPI
by the test's setup, standing in for PyPI the way npm_registry.py stands in for npm."""

from __future__ import annotations

import html
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["PyIndex", "normalized"]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class PyIndex:
    """`with PyIndex(wheels, host) as index:` serves `index.url` (…/simple/); `requests` counts what was asked."""

    def __init__(self, wheels: Path, host: str = "127.0.0.1"):
        self.files = {path.name: path for path in wheels.glob("*.whl")}
        self.requests: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                self.answer(with_body=False)

            def do_GET(self):
                self.answer(with_body=True)

            def answer(self, with_body: bool):
                index.requests.append(self.path)
                parts = [part for part in self.path.split("?")[0].split("/") if part]
                if len(parts) == 2 and parts[0] == "simple":
                    body, kind = index.project_page(parts[1]), "text/html"
                elif len(parts) == 2 and parts[0] == "files" and parts[1] in index.files:
                    body, kind = index.files[parts[1]].read_bytes(), "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self._server.server_address[1]}/simple/"

    def project_page(self, project: str) -> bytes | None:
        wheels = sorted(name for name in self.files if normalized(name.split("-")[0]) == normalized(project))
        if not wheels:
            return None
        links = "".join(f'<a href="../../files/{html.escape(name)}">{html.escape(name)}</a>\n' for name in wheels)
        return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()

    def __enter__(self) -> "PyIndex":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
