"""A real HTTP model server for tests: speaks the OpenAI and Anthropic streaming wire protocols
and answers from a script. The model is the one thing tests never run, so this stands in for it
— over real sockets, so the provider under test is exercised exactly as in production.

Usage::

    from tests.support.llm_server import ScriptedLLMServer, reply, tool_call, failure, drop

    steps = [
        failure(503),                                   # first request: HTTP 503 (retried)
        reply("Let me look.",                           # then text + two tool calls in one reply
              tool_call("shell", {"command": "echo hi"}),
              tool_call("read_file", {"path": "missing.txt"})),
        reply("All done."),                             # final answer
    ]
    with ScriptedLLMServer(steps) as llm:
        env["AGENTMESH_LLM_BASE_URL"] = llm.base_url    # "http://127.0.0.1:<port>/v1"
        ...                                             # run the agent
        assert llm.requests[1].body["messages"][-1]["role"] == "user"
        assert llm.requests[1].headers["authorization"] == "Bearer sk-..."

Endpoints (any prefix; `base_url` ends in /v1):
    POST …/chat/completions   OpenAI chat completions. With `"stream": true`: SSE
        `chat.completion.chunk`s — a role chunk, text in `chunk_chars` pieces, each tool call as
        a head chunk (index, id, name) followed by its `arguments` JSON split into `chunk_chars`
        pieces (interleaved across calls when `interleave=True`), a finish_reason chunk, a usage
        chunk (only if `stream_options.include_usage`), then `data: [DONE]`. Without streaming:
        one `chat.completion` JSON object.
    POST …/messages           Anthropic Messages streaming: message_start (input usage), ping,
        a text block (text_delta pieces), tool_use blocks (input_json_delta pieces),
        message_delta (stop_reason, output usage), message_stop.
    GET  …/models             a one-model list (`listing` replaces it; consumes no step).
    POST …/api/show           Ollama's model details: `show` when given, else 404.
    Neither is a model call: they are recorded in `llm.probes`, not `llm.requests` (the agent
    asks them once at start-up, for a model's context window).

Steps (consumed one per request, in arrival order; thread-safe):
    reply(text="", *tool_calls, usage=(input, output), chunk_chars=4, interleave=False,
          delay_s=0, pause_after_chunks=None, pause_s=0, drop_after_chunks=None, model=None,
          finish_reason=None, reasoning="")
        `finish_reason` overrides the natural one (`"length"`: a reply cut off by the output
        limit); `reasoning` streams as OpenAI `reasoning_content` deltas before the text.
        `delay_s` waits before the response head (for read-timeout tests);
        `pause_after_chunks`/`pause_s` stall mid-stream (`hold=threading.Event()` instead:
        until the test sets it); `drop_after_chunks` closes the
        connection mid-stream (chunked encoding left incomplete); `as_json=True` answers with
        one non-streamed completion object, like servers that ignore `stream`.
    tool_call(name, arguments: dict | str, id=None)
    failure(status=503, retry_after=None, message="…", delay_s=0)   an error answer, with
        `Retry-After` when given; the body is each API's error JSON.
    drop(delay_s=0)   closes the connection without a byte of response.
    A callable `step(request: RecordedRequest) -> step` decides from the request.
When the steps run out, `default` (a step or callable) answers; without one, HTTP 400 with
"script exhausted" (400, not 5xx, so that clients do not retry it).

Protocol checks: `ScriptedLLMServer(check_protocol=True)` answers an OpenAI request whose
messages break the tool-call protocol as OpenAI does — HTTP 400 naming the problem, no step
consumed: every assistant `tool_calls` must be followed at once by one `tool` message per call
id, and every `tool` message must answer a call of that assistant message
(`protocol_errors(messages)` gives the problems of a message list).

The wire formats themselves (each API's events, the OpenAI tool-call pairing rules) are in
`llm_wire.py`.

Recording: `llm.requests` is a list of `RecordedRequest(index, method, path, headers, body,
received_at, peer)`; header names are lower-case, `body` is the parsed JSON, `peer` the client's
host:port (equal for two requests on one kept-alive connection). `llm.wait_for_requests(n,
timeout)` blocks until n requests arrived (use `await asyncio.to_thread(...)` from async tests).
`llm.add(*steps)` appends steps while running. `llm.reported_usage` lists what the server
reported for each answered model call, in answer order: `(input, output, cached)` as the client
should count it (input includes cached tokens for both APIs).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence

from tests.support.llm_wire import anthropic_events, openai_completion, openai_events, protocol_errors


@dataclass(frozen=True)
class ToolCallSpec:
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    @property
    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    text: str = ""
    tool_calls: tuple[ToolCallSpec, ...] = ()
    usage: tuple[int, int] = (10, 5)
    chunk_chars: int = 4
    interleave: bool = False
    delay_s: float = 0.0
    pause_after_chunks: int | None = None
    pause_s: float = 0.0
    # Set by the test to end the pause: the stream stalls until then (or the server closes), so
    # a test that must see a turn mid-answer waits on a condition, not on how fast the machine is.
    hold: threading.Event | None = None
    drop_after_chunks: int | None = None
    model: str | None = None
    as_json: bool = False  # answer with one JSON completion even when streaming was asked for
    finish_reason: str | None = None  # e.g. "length" (OpenAI) / "max_tokens" (Anthropic); None: the natural one
    reasoning: str = ""  # OpenAI: streamed as `reasoning_content` deltas before the text
    # Of the input tokens, those "read from the prompt cache": OpenAI `prompt_tokens_details.cached_tokens`,
    # Anthropic `cache_read_input_tokens` (Anthropic's `input_tokens` then excludes them, as its API does).
    cached_tokens: int = 0


@dataclass(frozen=True)
class Failure:
    status: int = 503
    retry_after: float | str | None = None
    message: str = "the server is overloaded"
    delay_s: float = 0.0


@dataclass(frozen=True)
class Drop:
    delay_s: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    index: int
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float
    peer: str = ""  # the client's "host:port": the same peer twice means a reused connection

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list((self.body or {}).get("messages") or [])


Step = Reply | Failure | Drop | Callable[[RecordedRequest], Any]


def tool_call(name: str, arguments: dict[str, Any] | str | None = None, id: str | None = None) -> ToolCallSpec:
    return ToolCallSpec(name=name, arguments={} if arguments is None else arguments, id=id)


def reply(text: str = "", *tool_calls: ToolCallSpec, **options: Any) -> Reply:
    return Reply(text=text, tool_calls=tuple(tool_calls), **options)


def failure(status: int = 503, retry_after: float | str | None = None, message: str = "the server is overloaded",
            delay_s: float = 0.0) -> Failure:
    return Failure(status=status, retry_after=retry_after, message=message, delay_s=delay_s)


def drop(delay_s: float = 0.0) -> Drop:
    return Drop(delay_s=delay_s)


class _Dropped(Exception):
    """Raised inside the handler to abandon the connection mid-answer."""


class _QuietHTTPServer(ThreadingHTTPServer):
    # Benchmarks open dozens of connections at once; the default backlog of 5 resets some.
    request_queue_size = 256
    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients closing keep-alive connections (or tests cancelling mid-answer) are normal here.
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class ScriptedLLMServer:
    def __init__(self, steps: Sequence[Step] = (), default: Step | None = None, host: str = "127.0.0.1",
                 check_protocol: bool = False, listing: dict[str, Any] | None = None,
                 show: dict[str, Any] | None = None):
        self.listing = listing or {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
        self.show = show
        self.probes: list[tuple[str, str]] = []  # (method, path) of the requests that are not model calls
        self._steps: list[Step] = list(steps)
        self.check_protocol = check_protocol
        self._default = default
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._requests: list[RecordedRequest] = []
        self._reported: list[tuple[int, int, int]] = []
        self._closing = threading.Event()
        self._httpd = _QuietHTTPServer((host, 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- public surface ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def reported_usage(self) -> list[tuple[int, int, int]]:
        with self._lock:
            return list(self._reported)

    def _report(self, step: "Reply", include_usage: bool = True) -> None:
        if include_usage:
            with self._lock:
                self._reported.append((step.usage[0], step.usage[1], step.cached_tokens))

    def add(self, *steps: Step) -> None:
        with self._lock:
            self._steps.extend(steps)

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[RecordedRequest]:
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self._requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"expected {count} requests, got {len(self._requests)} within {timeout}s")
                self._arrived.wait(left)
            return list(self._requests)

    def start(self) -> "ScriptedLLMServer":
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-llm", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "ScriptedLLMServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _record(self, method: str, path: str, headers: dict[str, str], body: Any,
                consume: bool = True, peer: str = "") -> tuple[RecordedRequest, Any]:
        """Record a request and, for model calls, take the step that answers it."""
        with self._arrived:
            request = RecordedRequest(len(self._requests), method, path, headers, body, time.time(), peer)
            self._requests.append(request)
            self._arrived.notify_all()
            if not consume:
                return request, None
            step = self._steps.pop(0) if self._steps else self._default
        while callable(step) and not isinstance(step, (Reply, Failure, Drop)):
            step = step(request)
        return request, step

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._closing.wait(seconds)

    def _hold(self, hold: threading.Event) -> None:
        while not hold.wait(0.05) and not self._closing.is_set():
            pass

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _peer(self) -> str:
                host, port = self.client_address[:2]
                return f"{host}:{port}"

            def setup(self) -> None:
                super().setup()
                # Answer "instantly": no Nagle delay between the small SSE writes.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                server.probes.append(("GET", self.path))
                if self.path.rstrip("/").endswith("/models"):
                    self._json(200, server.listing)
                else:
                    self._json(404, {"error": {"message": f"no route for GET {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                headers = {k.lower(): v for k, v in self.headers.items()}
                anthropic = self.path.rstrip("/").endswith("/messages")
                if self.path.rstrip("/").endswith("/api/show"):
                    server.probes.append(("POST", self.path))
                    if server.show is None:
                        self._json(404, {"error": "not found"})
                    else:
                        self._json(200, server.show)
                    return
                if not (anthropic or self.path.rstrip("/").endswith("/chat/completions")):
                    server._record("POST", self.path, headers, body, consume=False, peer=self._peer())
                    self._json(404, {"error": {"message": f"no route for POST {self.path}"}})
                    return
                if server.check_protocol and not anthropic and isinstance(body, dict):
                    problems = protocol_errors(body.get("messages") or [])
                    if problems:
                        server._record("POST", self.path, headers, body, consume=False, peer=self._peer())
                        self._error(400, "invalid request: " + "; ".join(problems), anthropic)
                        return
                request, step = server._record("POST", self.path, headers, body, peer=self._peer())
                try:
                    self._answer(step, request, anthropic)
                except (_Dropped, BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

            def _answer(self, step: Any, request: RecordedRequest, anthropic: bool) -> None:
                if step is None:
                    self._error(400, f"ScriptedLLMServer: script exhausted at request {request.index}", anthropic)
                elif isinstance(step, Drop):
                    server._sleep(step.delay_s)
                    raise _Dropped()
                elif isinstance(step, Failure):
                    server._sleep(step.delay_s)
                    extra = {"Retry-After": str(step.retry_after)} if step.retry_after is not None else {}
                    self._error(step.status, step.message, anthropic, extra)
                elif isinstance(step, Reply):
                    server._sleep(step.delay_s)
                    model = step.model or (request.body or {}).get("model") or "scripted"
                    if anthropic:
                        self._stream(step, anthropic_events(step, model))
                        server._report(step)
                    elif (request.body or {}).get("stream") and not step.as_json:
                        include_usage = bool(((request.body or {}).get("stream_options") or {}).get("include_usage"))
                        self._stream(step, openai_events(step, model, include_usage))
                        server._report(step, include_usage)
                    else:
                        self._json(200, openai_completion(step, model))
                        server._report(step)
                else:
                    raise TypeError(f"not a step: {step!r}")

            # --- plumbing ---

            def _json(self, status: int, payload: Any, extra: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()

            def _error(self, status: int, message: str, anthropic: bool, extra: dict[str, str] | None = None) -> None:
                if anthropic:
                    kind = "overloaded_error" if status in (503, 529) else "rate_limit_error" if status == 429 else "api_error"
                    self._json(status, {"type": "error", "error": {"type": kind, "message": message}}, extra)
                else:
                    self._json(status, {"error": {"message": message, "type": "server_error", "code": status}}, extra)

            def _write_chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _stream(self, step: Reply, events: list[bytes]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for n, event in enumerate(events):
                    if step.drop_after_chunks is not None and n >= step.drop_after_chunks:
                        raise _Dropped()
                    if step.pause_after_chunks is not None and n == step.pause_after_chunks:
                        server._sleep(step.pause_s)
                        if step.hold is not None:
                            server._hold(step.hold)
                    self._write_chunk(event)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler
