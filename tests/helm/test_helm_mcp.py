"""tools.mcpServers becomes the tools service's AGENTMESH_MCP_SERVERS file, in the shared shape."""

from __future__ import annotations

import json

import helm_python
import pytest

from tests.helm.helm_support import RELEASE, container_env, render

SERVERS = {"docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${AGENTMESH_MCP_SECRET_DOCS}"}}}


def test_mcp_servers_are_mounted_into_the_tools_service_only():
    rendered = render({"tools": {"mcpServers": SERVERS}})
    config = rendered.get("ConfigMap", f"{RELEASE}-mcp-servers")
    assert json.loads(config["data"]["mcp-servers.json"]) == {"mcpServers": SERVERS, "a2aAgents": {}}
    tools = rendered.deployment("tools")["spec"]["template"]["spec"]
    [container] = tools["containers"]
    path = container_env(container)["AGENTMESH_MCP_SERVERS"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "mcp-servers")
    assert path == mount["mountPath"] + "/mcp-servers.json" and mount["readOnly"]
    agent = rendered.deployment("agent")["spec"]["template"]["spec"]["containers"][0]
    assert "AGENTMESH_MCP_SERVERS" not in container_env(agent)


def test_remote_a2a_agents_go_into_the_same_file():
    agents = {"research": {"url": "https://research.example.com", "headers": {"Authorization": "Bearer ${AGENTMESH_MCP_SECRET_R}"}}}
    rendered = render({"tools": {"a2aAgents": agents}})
    config = rendered.get("ConfigMap", f"{RELEASE}-mcp-servers")
    assert json.loads(config["data"]["mcp-servers.json"]) == {"mcpServers": {}, "a2aAgents": agents}
    [container] = rendered.deployment("tools")["spec"]["template"]["spec"]["containers"]
    assert container_env(container)["AGENTMESH_MCP_SERVERS"] == "/etc/agentmesh/mcp/mcp-servers.json"
    with pytest.raises(helm_python.HelmError):
        render({"tools": {"a2aAgents": {"research": {"url": "ftp://x"}}}})


def test_no_mcp_servers_renders_nothing_for_them():
    rendered = render()
    assert rendered.find("ConfigMap", f"{RELEASE}-mcp-servers") is None
    assert "AGENTMESH_MCP_SERVERS" not in container_env(rendered.deployment("tools")["spec"]["template"]["spec"]["containers"][0])


def test_stdio_servers_are_accepted_as_pods_would_run_them():
    servers = {"time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "image": "ghcr.io/example/mcp-time:1",
                        "env": {"TOKEN": "${AGENTMESH_MCP_SECRET_TIME}"}, "network": True}}
    rendered = render({"tools": {"mcpServers": servers}})
    config = rendered.get("ConfigMap", f"{RELEASE}-mcp-servers")
    assert json.loads(config["data"]["mcp-servers.json"])["mcpServers"] == servers
    assert rendered.config()["AGENTMESH_SANDBOX"] == "kubernetes"  # the tools service runs them as pods
    config = rendered.config()
    assert (config["AGENTMESH_SANDBOX_MCP_CPU_LIMIT"], config["AGENTMESH_SANDBOX_MCP_MEMORY_LIMIT"]) == ("500m", "256Mi")
    resized = render({"sandbox": {"mcpMemoryLimit": "512Mi"}}).config()
    assert resized["AGENTMESH_SANDBOX_MCP_MEMORY_LIMIT"] == "512Mi"


@pytest.mark.parametrize("servers", [{"bad name": {"url": "https://x/mcp"}}, {"docs": {"url": "ftp://x"}},
                                     {"docs": {"command": "x", "url": "https://x/mcp"}}, {"docs": {}},
                                     {"docs": {"command": "x", "mounts": ["/opt/mcp"]}},  # the local jail's only
                                     {"docs": {"command": "x", "image": "not an image"}},
                                     {"docs": {"url": "https://x/mcp", "network": True}}])
def test_the_schema_refuses_what_the_service_would(servers):
    with pytest.raises(helm_python.HelmError):
        render({"tools": {"mcpServers": servers}})


def test_mcp_secrets_are_one_projected_directory_of_the_tools_pods():
    servers = {"docs": {"url": "https://mcp.example.com/mcp",
                        "headers": {"Authorization": {"secretRef": "DOCS_TOKEN", "prefix": "Bearer "}}}}
    rendered = render({"tools": {"mcpServers": servers, "mcpSecrets": [
        {"secretName": "docs-mcp"}, {"secretName": "team-a-mcp", "namespace": "team-a", "keys": ["CALC_TOKEN"]}]}})
    config = rendered.get("ConfigMap", f"{RELEASE}-mcp-servers")
    assert json.loads(config["data"]["mcp-servers.json"])["mcpServers"] == servers
    tools = rendered.deployment("tools")["spec"]["template"]["spec"]
    [container] = tools["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "mcp-secrets")
    assert container_env(container)["AGENTMESH_MCP_SECRETS_DIR"] == mount["mountPath"] and mount["readOnly"]
    volume = next(v for v in tools["volumes"] if v["name"] == "mcp-secrets")
    assert volume["projected"]["sources"] == [
        {"secret": {"name": "docs-mcp"}},
        {"secret": {"name": "team-a-mcp", "items": [{"key": "CALC_TOKEN", "path": "team-a/CALC_TOKEN"}]}},
    ]
    for service in ("agent", "gateway", "memory"):
        spec = rendered.deployment(service)["spec"]["template"]["spec"]
        assert "mcp-secrets" not in {v["name"] for v in spec["volumes"]}


@pytest.mark.parametrize("secrets", [[{"secretName": "x", "namespace": "team-a"}], [{"name": "x"}],
                                     [{"secretName": "x", "namespace": "team-a", "keys": ["../x"]}]])
def test_the_schema_refuses_mcp_secrets_it_cannot_mount(secrets):
    with pytest.raises(helm_python.HelmError):
        render({"tools": {"mcpSecrets": secrets}})


def test_sandbox_templates_are_mounted_into_the_tools_service_only():
    templates = {"data": {"image": "ghcr.io/agentmesh/agentmesh-sandbox-data:1", "memory": "4Gi", "isolation": "session"},
                 "web": {"network": "egress"}}
    rendered = render({"sandbox": {"templates": templates}})
    config = rendered.get("ConfigMap", f"{RELEASE}-sandbox-templates")
    assert json.loads(config["data"]["templates.json"]) == {"templates": templates}
    [container] = rendered.deployment("tools")["spec"]["template"]["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "sandbox-templates")
    assert container_env(container)["AGENTMESH_SANDBOX_TEMPLATES"] == mount["mountPath"] + "/templates.json"
    agent = rendered.deployment("agent")["spec"]["template"]["spec"]["containers"][0]
    assert "AGENTMESH_SANDBOX_TEMPLATES" not in container_env(agent)
    plain = render()
    assert plain.find("ConfigMap", f"{RELEASE}-sandbox-templates") is None
    for bad in ({"Data": {}}, {"web": {"network": "open"}}, {"x": {"memory": "lots"}}, {"x": {"colour": "red"}}):
        with pytest.raises(helm_python.HelmError):
            render({"sandbox": {"templates": bad}})
