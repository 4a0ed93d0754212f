"""Tool policies and permission modes as the gateway keeps them (docs/approvals.md).

The layers — the deployment's (AGENTMESH_GATEWAY_TOOLS_*), the namespace's (kept by the memory
service), the session's — apply to every turn: the gateway sends the deployment's with the turn,
and the agent reads the others with the turn's start (agent/session_open.py) and offers a tool
only when every layer allows it; a turn's own ChatOptions.tools is one more layer, so it can
narrow and never widen. Policies people set are checked here against the catalog, so a misspelt name is refused
rather than silently matching nothing.

Plain async Python over the ports below, like `core.py`.
"""

from __future__ import annotations

import json
from typing import Protocol, Sequence

from agentmesh import error_reasons
from agentmesh.errors import AgentmeshError, InvalidArgument, Unavailable
from agentmesh.ids import validate_namespace
from agentmesh.toolargs import ArgumentsSchema, decode_arguments
from agentmesh.toolpolicy import AGENT_TOOLS, ToolPolicy, allowed_by_all, session_layers, validate_policy
from agentmesh.v1 import common_pb2, sessions_pb2, tools_pb2

__all__ = ["NamespaceSettingsStore", "Policies", "policy_of", "policy_to_proto"]


class NamespaceSettingsStore(Protocol):
    async def get_namespace_settings(self, namespace: str) -> sessions_pb2.NamespaceSettings: ...
    async def update_namespace_settings(
        self, request: sessions_pb2.UpdateNamespaceSettingsRequest) -> sessions_pb2.NamespaceSettings: ...


class ToolCatalog(Protocol):
    async def list_tools(self, namespace: str = "") -> tools_pb2.ListToolsResponse: ...
    async def sandbox_templates(self) -> list[str]: ...


def policy_of(message: common_pb2.ToolPolicy) -> ToolPolicy:
    return ToolPolicy(tuple(message.allow), tuple(message.deny))


def policy_to_proto(policy: ToolPolicy) -> common_pb2.ToolPolicy:
    return common_pb2.ToolPolicy(allow=policy.allow, deny=policy.deny)


class Policies:
    def __init__(self, namespaces: NamespaceSettingsStore, catalog: ToolCatalog, *, deployment: ToolPolicy,
                 permission_mode: str):
        self._namespaces = namespaces
        self._catalog = catalog
        self.deployment = deployment
        self.permission_mode = permission_mode  # a session's mode when it has none set

    async def known_tools(self) -> frozenset[str]:
        try:
            catalog = await self._catalog.list_tools()
        except AgentmeshError as exc:
            raise Unavailable(f"the tool names cannot be checked now: {exc.message}") from None
        return frozenset(t.name for t in catalog.tools) | AGENT_TOOLS

    async def check_arguments(self, namespace: str, tool: str, arguments_json: str) -> None:
        """Arguments a person edited a held call to run with: a JSON object, and valid for the
        tool's schema when the tools service runs the tool (the agent checks its own tools' when
        it runs them, as it does the model's)."""
        try:
            if not isinstance(decode_arguments(arguments_json, "the edited arguments"), dict):
                raise ValueError("the edited arguments must be a JSON object, as a tool call's are")
            try:
                catalog = await self._catalog.list_tools(namespace)
            except AgentmeshError as exc:
                raise Unavailable(f"the edited arguments cannot be checked now: {exc.message}") from None
            spec = next((t for t in catalog.tools if t.name == tool), None)
            if spec is not None and spec.parameters_json_schema:
                ArgumentsSchema(tool, json.loads(spec.parameters_json_schema)).parse(arguments_json)
        except ValueError as exc:
            raise InvalidArgument(f"{exc}; the call is still waiting for a decision", field="arguments_json") from None

    async def checked(self, message: common_pb2.ToolPolicy, what: str) -> ToolPolicy:
        """A policy a person sets, every plain name checked against the catalog."""
        validate_policy(message.allow, message.deny, what)  # the form first, without a hop
        return validate_policy(message.allow, message.deny, what, await self.known_tools())

    async def checked_template(self, name: str) -> str:
        """A sandbox template a person chooses for a namespace: one the tools service has ("": the default)."""
        if not name:
            return name
        try:
            known = await self._catalog.sandbox_templates()
        except AgentmeshError as exc:
            raise Unavailable(f"the sandbox templates cannot be checked now: {exc.message}") from None
        if name not in known:
            raise InvalidArgument(f"there is no sandbox template {name[:80]!r}; this deployment has {', '.join(known)} "
                                  "(agentmesh sandbox templates)", reason=error_reasons.UNKNOWN_SANDBOX_TEMPLATE,
                                  metadata={"field": "sandbox_template", "template": name[:80]})
        return name

    async def namespace_settings(self, namespace: str) -> sessions_pb2.NamespaceSettings:
        return await self._namespaces.get_namespace_settings(validate_namespace(namespace or "default"))

    async def update_namespace_settings(
            self, request: sessions_pb2.UpdateNamespaceSettingsRequest) -> sessions_pb2.NamespaceSettings:
        namespace = validate_namespace(request.namespace or "default")
        policy = await self.checked(request.tools, "tools")
        checked = sessions_pb2.UpdateNamespaceSettingsRequest(namespace=namespace, tools=policy_to_proto(policy))
        if request.HasField("retention"):  # absent: memory keeps the namespace's retention
            checked.retention.CopyFrom(request.retention)
        if request.HasField("sandbox_template"):  # absent: memory keeps the namespace's template
            checked.sandbox_template = await self.checked_template(request.sandbox_template)
        if request.HasField("models"):  # absent: memory keeps the namespace's models
            checked.models.CopyFrom(request.models)
        return await self._namespaces.update_namespace_settings(checked)

    async def layers(self, session: sessions_pb2.Session | None, namespace: str) -> list[ToolPolicy]:
        """The deployment's, the namespace's and the session's policies, the empty ones left out
        (a turn's are resolved the same way by the agent, from what its StartTurn read)."""
        settings = await self.namespace_settings(session.namespace if session is not None else namespace)
        return session_layers(self.deployment, policy_of(settings.tools),
                              policy_of(session.tools) if session is not None else None)

    @staticmethod
    def filter(tools: Sequence[tools_pb2.ToolSpec], layers: Sequence[ToolPolicy]) -> list[tools_pb2.ToolSpec]:
        return [t for t in tools if allowed_by_all(layers, t.name)]
