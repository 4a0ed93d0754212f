"""The gateway as an MCP server: a streamable-HTTP endpoint at /mcp (the `mcp` SDK's MCPServer)
whose tool `ask_agent` runs one turn of an agentmesh agent (the default one, or a named agent
given as `agent`), so MCP clients (IDEs, desktop
assistants) can hand work to it.

The SDK owns the protocol (initialize, tools/list, tools/call, progress notifications, the
streamable-HTTP transport, stateless so any gateway replica can answer). The endpoint is served
through the gateway's ASGI bridge (http/asgi.py) behind the gateway's bearer-token check: every
request's `Authorization` header must be one the gateway's gRPC interceptor takes, and the turn
runs with it.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, Field
from starlette.applications import Starlette

from agentmesh.errors import AgentmeshError
from agentmesh.gateway.http.asgi import call_asgi
from agentmesh.gateway.http.errors import error_response
from agentmesh.gateway.http.loopback import CallerRefused, GatewayCalls
from agentmesh.gateway.http.server import SECURITY_HEADERS
from agentmesh.ids import new_id, validate_id
from agentmesh.logs import get_logger
from agentmesh.v1 import gateway_pb2

log = get_logger("agentmesh.gateway.mcp")

MCP_PATH = "/mcp"
MAX_MESSAGE_CHARS = 100_000


class AgentAnswer(BaseModel):
    session: str = Field(description="The session the turn ran in; pass it again to continue the conversation.")
    reply: str = Field(description="The agent's final answer.")
    stop_reason: str = Field(description="completed, max_iterations, cancelled, budget, ...")
    run_id: str
    trace_id: str


class McpEndpoint:
    def __init__(self, *, description: str, version: str):
        self._calls: GatewayCalls | None = None  # the gateway's own API, once the HTTP server runs
        self._server = MCPServer("agentmesh", instructions=description, version=version)
        self._server.tool(name="ask_agent", description=(
            "Ask the agentmesh agent to do something: it plans, runs tools in a sandbox and answers. "
            "Give `session` to continue an earlier conversation (its id is in the answer); leave it out to start one. "
            "Give `agent` to ask one of the namespace's named agents (NAME or NAME@VERSION, e.g. explore, code, plan); "
            "leave it out for the default agent."
        ))(self._ask_agent)
        # The gateway's own middleware checks the Host header; a pod is reached by names the SDK's
        # loopback-only default would refuse.
        self._app: Starlette = self._server.streamable_http_app(
            streamable_http_path=MCP_PATH, stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._running: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", MCP_PATH, self._handle)

    async def start(self, calls: GatewayCalls) -> None:
        self._calls = calls
        started = asyncio.Event()

        async def run() -> None:
            # The SDK's session manager keeps a task group for the lifetime of the endpoint; it
            # must be entered and left in one task.
            async with self._server.session_manager.run():
                started.set()
                await self._stop.wait()

        self._running = asyncio.create_task(run(), name="mcp-endpoint")
        await started.wait()

    async def stop(self) -> None:
        self._stop.set()
        if self._running is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._running

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            await self.calls.check_caller(request.headers.get("Authorization"))
        except CallerRefused as exc:
            response = error_response(exc.code, exc.message)
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return await call_asgi(self._app, request, headers=SECURITY_HEADERS)

    @property
    def calls(self) -> GatewayCalls:
        if self._calls is None:
            raise RuntimeError("the MCP endpoint is not started")
        return self._calls

    async def _ask_agent(self, message: str, ctx: Context, session: str = "", agent: str = "") -> AgentAnswer:
        if not message.strip():
            raise ToolError("message is empty: say what the agent should do")
        if len(message) > MAX_MESSAGE_CHARS:
            raise ToolError(f"message is longer than {MAX_MESSAGE_CHARS} characters")
        try:
            session_id = validate_id(session) if session else new_id("mcp")
        except AgentmeshError as exc:
            raise ToolError(exc.message) from None
        authorization = (ctx.headers or {}).get("authorization")
        answer = AgentAnswer(session=session_id, reply="", stop_reason="", run_id="", trace_id="")
        step = 0
        try:
            async for event in self.calls.chat(session_id, message, authorization,
                                                 gateway_pb2.ChatOptions(agent=agent.strip())):
                kind = event.WhichOneof("payload")
                if kind == "run_started":
                    answer.run_id, answer.trace_id = event.run_started.run_id, event.run_started.trace_id
                elif kind == "tool_call":
                    step += 1
                    await ctx.report_progress(step, message=f"calling {event.tool_call.name}")
                elif kind == "run_finished":
                    answer.reply = event.run_finished.final_text
                    answer.stop_reason = event.run_finished.stop_reason
                elif kind == "error":
                    raise ToolError(f"{event.error.code}: {event.error.message}")
        except (CallerRefused, AgentmeshError) as exc:
            raise ToolError(f"{exc.code}: {exc.message}") from None
        if not answer.stop_reason:
            raise ToolError("the turn ended without finishing")
        return answer
