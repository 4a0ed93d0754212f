"""The A2A agents of every namespace, served by the a2a-sdk on the gateway's HTTP address.

    GET  /.well-known/agent-card.json              the default namespace's agent card
    GET  /a2a/<namespace>/.well-known/agent-card.json
    POST /a2a/<namespace>/                          JSON-RPC: SendMessage, SendStreamingMessage,
                                                    GetTask, CancelTask, ... (and the A2A 0.3
                                                    names message/send, message/stream, tasks/*)
    GET  /a2a/<namespace>/<agent>/.well-known/agent-card.json
    POST /a2a/<namespace>/<agent>/                  the same, each turn running that named agent
                                                    (docs/agents.md), its card from its definition

One a2a-sdk application (its card and JSON-RPC routes, DefaultRequestHandler, a task store) per
namespace, and per named agent of a namespace, made on first use and kept for the most recently used namespaces. The task store keeps
the replica's recent tasks in memory and writes each one through to the memory service when its
state changes, so `tasks/get` of a task another replica ran (or ran before a restart) is answered
from there. The applications
are Starlette apps: they run through the gateway's small ASGI bridge (http/asgi.py).

Authentication is the gateway's: a JSON-RPC request is let through only when the gateway's
caller check (the one its gRPC interceptor runs) takes its `Authorization` header and the caller
may see the namespace, and the turn then runs with that header, for that principal. The request
runs as that principal too, so what the task store reads and writes in the memory service is
signed for it and kept to its tenant. The agent card itself is public, as A2A discovery wants;
it says which scheme to use (HTTP bearer) when users sign in, and lists the namespace's tools
only to a caller who may see the namespace (everyone, where users do not sign in).
"""

from __future__ import annotations

import contextvars
from collections import OrderedDict
from typing import Awaitable, Callable, Protocol

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
)
from aiohttp import web
from google.protobuf.json_format import MessageToJson, Parse
from starlette.applications import Starlette

from agentmesh.errors import AgentmeshError, InvalidArgument, NotFound
from agentmesh.gateway.a2a.executor import TurnExecutor
from agentmesh.gateway.http.asgi import call_asgi
from agentmesh.gateway.http.errors import error_response
from agentmesh.gateway.http.loopback import CallerRefused, GatewayCalls, caller_metadata
from agentmesh.gateway.http.server import SECURITY_HEADERS
from agentmesh.ids import DEFAULT_NAMESPACE, validate_namespace
from agentmesh.logs import get_logger
from agentmesh.rpc.auth import CallerCheck, current_principal, current_scope
from agentmesh.rpc.identity import Principal
from agentmesh.v1 import agents_pb2, tools_pb2

log = get_logger("agentmesh.gateway.a2a")

CARD_PATH = "/.well-known/agent-card.json"
# Namespaces whose application is kept; one used after that many others is made again (its
# finished tasks are then forgotten: the turns themselves are in the session's transcript).
MAX_NAMESPACES = 256
# Tasks one namespace keeps for tasks/get, oldest forgotten first.
MAX_TASKS = 1000
MAX_SKILLS = 64
# The method a caller is checked for before anything of A2A runs (the cheapest one a viewer has).
SIGN_IN_METHOD = "/agentmesh.v1.Gateway/ListModels"

ToolLister = Callable[[str], Awaitable[tools_pb2.ListToolsResponse]]
# A named agent of a namespace (namespace, name): NOT_FOUND when it does not exist.
AgentLookup = Callable[[str, str], Awaitable[agents_pb2.AgentInfo]]

# The base URL of the request being answered, for the card's interface URL.
_request_base: contextvars.ContextVar[str] = contextvars.ContextVar("a2a_request_base", default="")


class BoundedTaskStore(InMemoryTaskStore):
    """The SDK's in-memory store, forgetting the oldest tasks past `limit`, so a long-running
    gateway does not keep every task it ever ran."""

    def __init__(self, limit: int = MAX_TASKS):
        super().__init__()
        self._limit = limit
        self._order: OrderedDict[str, None] = OrderedDict()

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        self._order[task.id] = None
        self._order.move_to_end(task.id)
        while len(self._order) > self._limit:
            oldest, _ = self._order.popitem(last=False)
            await super().delete(oldest, context)


class TaskRecords(Protocol):
    """Where tasks are kept for every replica (the memory service: peers.MemorySessions)."""

    async def put_a2a_task(self, namespace: str, task_id: str, task_json: str) -> None: ...
    async def get_a2a_task(self, namespace: str, task_id: str) -> str: ...


class SharedTaskStore(BoundedTaskStore):
    """The bounded in-memory store, written through to `records` whenever a task's state
    changes (submitted, working, then its end: a few writes per turn, not one per streamed
    chunk — the end carries the whole reply), and read from there for a task this replica does
    not hold. A write that fails is logged: the turn goes on, and the task is still answered
    here."""

    def __init__(self, namespace: str, records: TaskRecords, limit: int = MAX_TASKS):
        super().__init__(limit)
        self._namespace = namespace
        self._records = records
        self._written: OrderedDict[str, int] = OrderedDict()  # task id -> the state last written

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        if self._written.get(task.id) == task.status.state:
            return
        try:
            await self._records.put_a2a_task(self._namespace, task.id, MessageToJson(task))
        except AgentmeshError as exc:
            log.warning("A2A task not written to the memory service", task_id=task.id, error=exc.message)
            return
        self._written[task.id] = task.status.state
        self._written.move_to_end(task.id)
        while len(self._written) > self._limit:
            self._written.popitem(last=False)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        task = await super().get(task_id, context)
        if task is not None:
            return task
        try:
            return Parse(await self._records.get_a2a_task(self._namespace, task_id), Task(), ignore_unknown_fields=True)
        except NotFound:
            return None
        except AgentmeshError as exc:
            log.warning("A2A task not read from the memory service", task_id=task_id, error=exc.message)
            return None


class A2aEndpoints:
    def __init__(self, list_tools: ToolLister, *, description: str, version: str, public_url: str,
                 bearer_required: bool, max_depth: int, tasks: TaskRecords | None = None,
                 callers: CallerCheck | None = None, agents: AgentLookup | None = None):
        self._tasks = tasks
        self._agents = agents
        # The gateway's own caller check: who a request is for, without a loopback call.
        self._callers = callers
        self._max_depth = max_depth
        self._calls: GatewayCalls | None = None  # the gateway's own API, once the HTTP server runs
        self._list_tools = list_tools
        self._description = description
        self._version = version
        self._public_url = public_url.rstrip("/")
        self._bearer_required = bearer_required
        # Keyed by (namespace, agent); agent "" is the namespace's default agent.
        self._apps: OrderedDict[tuple[str, str], Starlette] = OrderedDict()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("GET", CARD_PATH, self._default_card)
        app.router.add_route("*", "/a2a/{namespace}", self._namespaced)
        app.router.add_route("*", "/a2a/{namespace}/{rest:.*}", self._namespaced)

    async def start(self, calls: GatewayCalls) -> None:
        self._calls = calls

    async def stop(self) -> None:
        self._apps.clear()

    @property
    def calls(self) -> GatewayCalls:
        if self._calls is None:
            raise RuntimeError("the A2A endpoints are not started")
        return self._calls

    # --- requests ----------------------------------------------------------------------------

    async def _default_card(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, DEFAULT_NAMESPACE, root_path="", principal=await self._reader(request))

    async def _namespaced(self, request: web.Request) -> web.StreamResponse:
        try:
            namespace = validate_namespace(request.match_info["namespace"])
        except InvalidArgument as exc:
            return error_response(exc.code, exc.message)
        root = f"/a2a/{request.match_info['namespace']}"
        agent = _agent_of(request.match_info.get("rest", ""))
        if agent:
            if not self._agents:
                return error_response("NOT_FOUND", "this gateway serves no named agents over A2A")
            root = f"{root}/{agent}"
        if request.method != "POST":
            return await self._serve(request, namespace, root_path=root, principal=await self._reader(request),
                                     agent=agent)
        authorization = request.headers.get("Authorization")
        try:
            if self._callers is None:
                await self.calls.check_caller(authorization)
                principal = None
            else:
                principal = await self._principal(authorization)
                # Another tenant's namespace: refused before its tasks or its agent are reached.
                self._callers.policy.scope(principal.tenant).require_namespace(namespace, "viewer")
        except CallerRefused as exc:
            return error_response(exc.code, exc.message)
        except AgentmeshError as exc:
            return error_response(exc.code, exc.message)
        return await self._serve(request, namespace, root_path=root, principal=principal, agent=agent)

    async def _principal(self, authorization: str | None) -> Principal:
        assert self._callers is not None
        decision = await self._callers.admit(SIGN_IN_METHOD, caller_metadata(authorization))
        if not isinstance(decision, Principal):
            raise CallerRefused(decision[0].name, decision[1])
        return decision

    async def _reader(self, request: web.Request) -> Principal | None:
        """Who reads a card: the caller its credentials name, if it sent valid ones."""
        if self._callers is None or not request.headers.get("Authorization"):
            return None
        try:
            return await self._principal(request.headers.get("Authorization"))
        except CallerRefused:
            return None

    async def _serve(self, request: web.Request, namespace: str, root_path: str,
                     principal: Principal | None, agent: str = "") -> web.StreamResponse:
        token = _request_base.set(self._public_url or f"{request.scheme}://{request.host}")
        # The request runs as its caller: the SDK's tasks (the executor, the task store) are
        # started from here and keep these, so the memory service sees whose task it is.
        who = current_principal.set(principal)
        scope = current_scope.set(self._callers.policy.scope(principal.tenant)
                                  if principal is not None and self._callers is not None else None)
        try:
            if agent and request.method == "GET":
                # The card of an agent that does not exist is a 404, to a caller who may see the namespace.
                try:
                    await self._agent_card(namespace, agent)
                except NotFound as exc:
                    return error_response(exc.code, exc.message)
                except AgentmeshError as exc:
                    log.warning("A2A card: the agent could not be read", namespace=namespace, agent=agent,
                                error=exc.message)
            return await call_asgi(self._app(namespace, agent), request, root_path=root_path, headers=SECURITY_HEADERS)
        finally:
            current_scope.reset(scope)
            current_principal.reset(who)
            _request_base.reset(token)

    # --- one application per namespace ------------------------------------------------------

    def _app(self, namespace: str, agent: str = "") -> Starlette:
        key = (namespace, agent)
        app = self._apps.get(key)
        if app is None:
            app = self._build(namespace, agent)
            self._apps[key] = app
            while len(self._apps) > MAX_NAMESPACES:
                self._apps.popitem(last=False)
        self._apps.move_to_end(key)
        return app

    def _build(self, namespace: str, agent: str = "") -> Starlette:
        card = self._base_card(namespace, "", agent)
        # Tasks are kept per namespace: a task id is unique, whichever agent ran it.
        store = SharedTaskStore(namespace, self._tasks) if self._tasks is not None else BoundedTaskStore()
        handler = DefaultRequestHandler(agent_executor=TurnExecutor(self.calls, namespace, self._max_depth, agent),
                                        task_store=store, agent_card=card)

        async def current_card(_card: AgentCard) -> AgentCard:
            return await self.card(namespace, _request_base.get(), agent)

        routes = [
            *create_agent_card_routes(card, card_modifier=current_card, card_url=CARD_PATH),
            *create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=True),
        ]
        return Starlette(routes=routes)

    def _base_card(self, namespace: str, base_url: str, agent: str = "", description: str = "") -> AgentCard:
        description = description or self._description
        path = f"/a2a/{namespace}/{agent}/" if agent else f"/a2a/{namespace}/"
        card = AgentCard(
            name=f"{agent} (agentmesh {namespace})" if agent else f"agentmesh ({namespace})",
            description=description,
            version=self._version,
            supported_interfaces=[AgentInterface(url=f"{base_url}{path}", protocol_binding="JSONRPC",
                                                 protocol_version="1.0")],
            capabilities=AgentCapabilities(streaming=True),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
            skills=[AgentSkill(id="chat", name="chat", description=description, tags=["agent"],
                               input_modes=["text/plain"], output_modes=["text/plain"])],
        )
        card.security_schemes["bearer"].CopyFrom(SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="Bearer", description="a token of the gateway's AGENTMESH_AUTH_TOKENS")))
        if self._bearer_required:
            requirement = SecurityRequirement()
            requirement.schemes["bearer"].CopyFrom(StringList())
            card.security_requirements.append(requirement)
        return card

    def _may_see(self, namespace: str) -> bool:
        principal = current_principal.get()
        return not (self._callers is not None and self._callers.policy.checks_users and (
            principal is None or not self._callers.policy.scope(principal.tenant).can(namespace, "viewer")))

    async def _agent_card(self, namespace: str, agent: str) -> str:
        """The named agent's description, read for a reader who may see the namespace (""
        otherwise: whether an agent exists is not said to anyone who asks)."""
        if self._agents is None or not self._may_see(namespace):
            return ""
        info = await self._agents(namespace, agent)
        return info.spec.description

    async def card(self, namespace: str, base_url: str, agent: str = "") -> AgentCard:
        """The namespace's card (or its named agent's, described by the agent's definition): its
        interface at `base_url`, and a skill per tool of its catalog for a reader who may see
        the namespace (the tools are listed as that reader)."""
        description = ""
        if agent:
            try:
                description = await self._agent_card(namespace, agent)
            except AgentmeshError:
                pass  # _serve already answered a missing agent; the card still answers otherwise
        card = self._base_card(namespace, base_url, agent, description)
        if not self._may_see(namespace):
            return card
        try:
            catalog = await self._list_tools(namespace)
        except AgentmeshError as exc:
            # The card still answers (discovery must not fail on the tools service); without tools.
            log.warning("A2A card: the tools could not be listed", namespace=namespace, error=exc.message)
            return card
        for tool in list(catalog.tools)[: MAX_SKILLS - 1]:
            card.skills.append(AgentSkill(id=f"tool:{tool.name}", name=tool.name, description=tool.description,
                                          tags=["tool"]))
        return card



def _agent_of(rest: str) -> str:
    """The named agent a path under /a2a/<namespace>/ is for: its first segment, unless that is
    the namespace's own card (`.well-known/...`) or JSON-RPC route (empty)."""
    first = rest.split("/", 1)[0]
    return "" if not first or first.startswith(".") else first
