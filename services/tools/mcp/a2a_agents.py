"""Remote A2A agents as tools: each entry of "a2aAgents" in the AGENTMESH_MCP_SERVERS file is one
tool, `a2a__<name>`, whose description is the agent card's. The a2a-sdk client does the protocol
(card resolution, SendStreamingMessage, CancelTask); this module turns its task into a tool result.

Depth: a turn started by an A2A message knows how deep in a chain of agents it is (the gateway
stores it on the session as the label `agentmesh.a2a.depth`); a call from that session sends
depth + 1 in the message's metadata, and an agentmesh gateway refuses a message deeper than its
AGENTMESH_GATEWAY_A2A_MAX_DEPTH. So agents calling each other, in a loop or not, stop after that
many hops, as sub-agents stop at theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any, Awaitable, Callable

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import AgentCard, CancelTaskRequest, Message, Part, Role, SendMessageRequest, TaskState

from agentmesh.logs import get_logger
from agentmesh.tooling import ToolSpec
from agentmesh.tools.catalog import CallContext, Tool, obj, string
from agentmesh.tools.mcp.config import A2aAgentEntry
from agentmesh.tools.mcp.connection import ServerUnavailable
from agentmesh.tools.mcp.openers import check_egress
from agentmesh.tools.results import ToolOutcome
from agentmesh.tools.settings import SandboxLimits
from agentmesh.tools.web_tools import AddressPolicy

log = get_logger("agentmesh.tools.a2a")

TOOL_PREFIX = "a2a__"
DEPTH_KEY = "agentmesh.a2a.depth"
REASON_KEY = "agentmesh.reason"
MAX_MESSAGE_CHARS = 32_000
MAX_DESCRIPTION_CHARS = 1024
_FAILED = {TaskState.TASK_STATE_FAILED: "failed", TaskState.TASK_STATE_REJECTED: "rejected",
           TaskState.TASK_STATE_CANCELED: "canceled", TaskState.TASK_STATE_AUTH_REQUIRED: "auth_required"}

SessionDepth = Callable[[str], Awaitable[int]]


def _text(parts: Any) -> str:
    return "".join(p.text for p in parts if p.HasField("text"))


class A2aAgentTools:
    """ToolProvider with one tool per remote agent; its card is read at start and again while the
    agent is unreachable."""

    dynamic = True

    def __init__(self, entries: list[A2aAgentEntry], policy: AddressPolicy, limits: SandboxLimits,
                 session_depth: SessionDepth, connect_timeout_s: float):
        self._entries = {e.name: e for e in entries}
        self._policy = policy
        self._limits = limits
        self._session_depth = session_depth
        self._connect_timeout_s = connect_timeout_s
        self._cards: dict[str, AgentCard] = {}
        self.errors: dict[str, str] = {}
        # Told when a card read changes the catalog (the tools service's catalog version).
        self.on_change: Callable[[], None] = lambda: None

    async def start(self) -> None:
        await asyncio.gather(*(self._refresh(name) for name in self._entries))

    async def close(self) -> None:
        return None

    def _http(self, entry: A2aAgentEntry, timeout_s: float) -> httpx.AsyncClient:
        # No environment proxies: a proxy would connect on our behalf, past the egress policy.
        return httpx.AsyncClient(headers=dict(entry.headers), trust_env=False,
                                 timeout=httpx.Timeout(timeout_s, connect=self._connect_timeout_s))

    async def _refresh(self, name: str) -> AgentCard | None:
        entry = self._entries[name]
        try:
            await check_egress(entry.url, self._policy)
            async with self._http(entry, self._connect_timeout_s) as http:
                card = await A2ACardResolver(http, entry.url).get_agent_card()
        except ServerUnavailable as exc:
            self.errors[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - any failure to read the card leaves the agent unavailable
            self.errors[name] = f"cannot read the agent card at {entry.url}: {type(exc).__name__}: {exc}"
        else:
            changed = self._cards.get(name) != card
            self._cards[name] = card
            self.errors.pop(name, None)
            if changed:
                self.on_change()
            return card
        log.warning("A2A agent unavailable", agent=name, error=self.errors[name])
        return None

    # --- the catalog ------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        return [self._tool(name, card) for name, card in self._cards.items()]

    def find(self, name: str) -> Tool | None:
        if not name.startswith(TOOL_PREFIX):
            return None
        agent = name[len(TOOL_PREFIX):]
        if agent not in self._entries:
            return None
        card = self._cards.get(agent)
        return self._tool(agent, card)

    def _tool(self, name: str, card: AgentCard | None) -> Tool:
        about = (card.description if card else "") or (card.name if card else name)
        skills = ", ".join(s.name for s in card.skills[:12]) if card else ""
        description = f"[A2A agent {name}] {about}"[:MAX_DESCRIPTION_CHARS]
        if skills:
            description += f" (skills: {skills})"
        spec = ToolSpec(name=TOOL_PREFIX + name, description=description, parameters=obj({
            "message": string("What to ask the agent, in plain words.", MAX_MESSAGE_CHARS, 1),
            "context_id": string("Continue an earlier conversation with this agent: the context_id of its answer.", 128),
        }, ["message"]))

        async def run(ctx: CallContext, arguments: dict[str, Any]) -> ToolOutcome:
            return await self._call(name, ctx, arguments)

        return Tool(spec, run)

    # --- one call ---------------------------------------------------------------------------

    async def _call(self, name: str, ctx: CallContext, arguments: dict[str, Any]) -> ToolOutcome:
        entry = self._entries[name]
        card = self._cards.get(name) or await self._refresh(name)
        if card is None:
            return ToolOutcome(output=f"A2A agent {name!r} is unavailable: {self.errors.get(name, 'no card')}",
                               is_error=True, error_kind="unavailable")
        timeout_s = min(ctx.caller_timeout_s or self._limits.max_timeout_s, self._limits.max_timeout_s)
        depth = await self._session_depth(ctx.session_id) + 1
        context_id = arguments.get("context_id") or f"a2a-{uuid.uuid4().hex}"
        message = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, context_id=context_id,
                          parts=[Part(text=arguments["message"])])
        message.metadata.update({DEPTH_KEY: depth})
        try:
            await check_egress(entry.url, self._policy)
        except ServerUnavailable as exc:
            return ToolOutcome(output=str(exc), is_error=True, error_kind="unavailable")
        async with self._http(entry, timeout_s) as http:
            client = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
            task_id = ""
            reply, state, said, reason = "", TaskState.TASK_STATE_UNSPECIFIED, "", ""
            try:
                async with asyncio.timeout(timeout_s):
                    async for update in client.send_message(SendMessageRequest(message=message)):
                        kind = update.WhichOneof("payload")
                        if kind == "task":
                            task_id, state = update.task.id, update.task.status.state
                        elif kind == "status_update":
                            task_id = task_id or update.status_update.task_id
                            state = update.status_update.status.state
                            said = _text(update.status_update.status.message.parts) or said
                            reason = str(update.status_update.metadata[REASON_KEY]) \
                                if REASON_KEY in update.status_update.metadata else reason
                        elif kind == "artifact_update":
                            reply += _text(update.artifact_update.artifact.parts)
                        elif kind == "message":
                            reply += _text(update.message.parts)
                            state = TaskState.TASK_STATE_COMPLETED
            except TimeoutError:
                await self._cancel(client, task_id)
                return ToolOutcome(output=f"A2A agent {name!r} did not finish within {timeout_s:g} s",
                                   is_error=True, error_kind="timeout")
            except asyncio.CancelledError:
                await self._cancel(client, task_id)
                raise
            except Exception as exc:  # noqa: BLE001 - the SDK's transport and protocol errors alike
                return ToolOutcome(output=f"A2A agent {name!r} failed: {type(exc).__name__}: {exc}",
                                   is_error=True, error_kind="unavailable")
            finally:
                with contextlib.suppress(Exception):
                    await client.close()
        data = {"a2a_agent": name, "context_id": context_id, "task_id": task_id,
                "state": TaskState.Name(state).removeprefix("TASK_STATE_").lower(), "depth": depth}
        if state in _FAILED:
            kind = reason or "a2a_error"  # an agentmesh agent says why, e.g. "depth_limit"
            return ToolOutcome(output=f"A2A agent {name!r} {_FAILED[state]} the task: {said or 'no reason given'}",
                               is_error=True, error_kind=kind, data=data)
        text = reply or said
        return ToolOutcome(output=f"{text}\n\n[context_id {context_id}: pass it to continue this conversation]",
                           data=data)

    async def _cancel(self, client: Any, task_id: str) -> None:
        if not task_id:
            return
        # Awaited whole (the call is being cancelled: this is its clean-up), within a bound.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.cancel_task(CancelTaskRequest(id=task_id)), 5)
