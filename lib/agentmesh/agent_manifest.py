"""The `kind: Agent` document (docs/agents.md) <-> `AgentSpec`: one reading for the two places a
definition arrives as YAML — `agentmesh agents create -f` and the Kubernetes `Agent` resource the
scheduler's controller syncs (the resource's `spec` is the file's `spec`).

The shape is checked here (a `ManifestError` names the field at fault); the memory service bounds
every field again when the spec is stored.
"""

from __future__ import annotations

from typing import Any

from agentmesh.v1 import agents_pb2, common_pb2

__all__ = ["API_GROUP", "API_VERSION", "CONTROLLER_SUBJECT", "GROUP_VERSION", "KIND", "SPEC_KEYS", "ManifestError", "document_of",
           "spec_from_document"]

API_GROUP = "agentmesh.dev"
GROUP_VERSION = "v1alpha1"
API_VERSION = f"{API_GROUP}/{GROUP_VERSION}"
KIND = "Agent"
# Whom the controller of Agent resources (the scheduler's leader) calls the gateway as: the one
# caller the gateway lets change the agents of a namespace in AGENTMESH_MANAGED_AGENT_NAMESPACES.
CONTROLLER_SUBJECT = "service:scheduler"
SPEC_KEYS = {"description", "instructions", "model", "modelParameters", "tools", "skills", "mcpServers",
             "subAgents", "budgets", "sandbox", "memory"}


class ManifestError(ValueError):
    """A document that is not a well-formed `kind: Agent`; `field` is where (e.g. `spec.tools.allow`)."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ManifestError(f"{where} must be a mapping", where)
    return value


def _names(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ManifestError(f"{where} must be a list of names", where)
    return list(value)


def _number(value: Any, where: str, kind: type) -> Any:
    if value is None:
        return kind(0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ManifestError(f"{where} must be a {'whole ' if kind is int else ''}number, not {value!r}", where)
    return kind(value)


def spec_from_document(document: Any) -> tuple[str, agents_pb2.AgentSpec]:
    """(metadata.namespace, the AgentSpec) of a parsed `kind: Agent` document."""
    doc = _mapping(document, "the document")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise ManifestError(f"expected apiVersion: {API_VERSION} and kind: {KIND}", "apiVersion")
    metadata = _mapping(doc.get("metadata"), "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError("metadata.name is missing: name the agent", "metadata.name")
    spec = _mapping(doc.get("spec"), "spec")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ManifestError(f"spec has unknown fields: {', '.join(unknown)} (known: {', '.join(sorted(SPEC_KEYS))})",
                            f"spec.{unknown[0]}")
    params = _mapping(spec.get("modelParameters"), "spec.modelParameters")
    tools = _mapping(spec.get("tools"), "spec.tools")
    budgets = _mapping(spec.get("budgets"), "spec.budgets")
    sandbox = _mapping(spec.get("sandbox"), "spec.sandbox")
    memory = _mapping(spec.get("memory"), "spec.memory")
    out = agents_pb2.AgentSpec(
        name=name, description=str(spec.get("description") or ""),
        instructions=str(spec.get("instructions") or ""), model=str(spec.get("model") or ""),
        tools=common_pb2.ToolPolicy(allow=_names(tools.get("allow"), "spec.tools.allow"),
                                    deny=_names(tools.get("deny"), "spec.tools.deny")),
        permission_mode=str(tools.get("permissionMode") or ""),
        approvals=_names(tools.get("approvals"), "spec.tools.approvals"),
        skills=_names(spec.get("skills"), "spec.skills"),
        mcp_servers=_names(spec.get("mcpServers"), "spec.mcpServers"),
        sub_agents=_names(spec.get("subAgents"), "spec.subAgents"),
        max_steps=_number(budgets.get("steps"), "spec.budgets.steps", int),
        token_budget=_number(budgets.get("tokens"), "spec.budgets.tokens", int),
        sandbox_template=str(sandbox.get("template") or ""), isolation=str(sandbox.get("isolation") or ""),
        memory_scope=str(memory.get("scope") or ""))
    if params.get("temperature") is not None:
        out.temperature = _number(params["temperature"], "spec.modelParameters.temperature", float)
    if params.get("topP") is not None:
        out.top_p = _number(params["topP"], "spec.modelParameters.topP", float)
    return str(metadata.get("namespace") or ""), out


def document_of(info: agents_pb2.AgentInfo) -> dict[str, Any]:
    """The YAML shape of a stored version: what `create -f` reads back."""
    s = info.spec
    spec: dict[str, Any] = {"description": s.description, "instructions": s.instructions}
    if s.model:
        spec["model"] = s.model
    params = {k: v for k, v in (("temperature", s.temperature if s.HasField("temperature") else None),
                                ("topP", s.top_p if s.HasField("top_p") else None)) if v is not None}
    if params:
        spec["modelParameters"] = params
    tools = {k: v for k, v in (("allow", list(s.tools.allow)), ("deny", list(s.tools.deny)),
                               ("permissionMode", s.permission_mode), ("approvals", list(s.approvals))) if v}
    if tools:
        spec["tools"] = tools
    for key, value in (("skills", s.skills), ("mcpServers", s.mcp_servers), ("subAgents", s.sub_agents)):
        if value:
            spec[key] = list(value)
    budgets = {k: v for k, v in (("steps", s.max_steps), ("tokens", s.token_budget)) if v}
    if budgets:
        spec["budgets"] = budgets
    sandbox = {k: v for k, v in (("template", s.sandbox_template), ("isolation", s.isolation)) if v}
    if sandbox:
        spec["sandbox"] = sandbox
    if s.memory_scope:
        spec["memory"] = {"scope": s.memory_scope}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": s.name, "namespace": info.namespace},
            "spec": spec}
