"""stdio MCP servers with AGENTMESH_SANDBOX=kubernetes: each a long-lived pod of its own, spoken to
over `pods/attach` — the unmodified `mcp-server-time` (PyPI) through the whole stack, against the
tests' Kubernetes API server (tests/tools/fake_kube.py), whose kubelet runs the container's
command as a local process and serves attach over a real websocket (v5/v4 channel protocol)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import grpc
import httpx
import pytest

from agentmesh.config import ConfigError
from agentmesh.internal.v1 import tools_service_pb2
from agentmesh.tools.mcp.pod_servers import owner_name
from agentmesh.v1 import gateway_pb2, tools_pb2
from tests.mcpservers.conftest import write_servers
from tests.protocols.conftest import TOKEN
from tests.support.llm_server import reply, tool_call
from tests.support.stack import Stack
from tests.support.timing import polling
from tests.support.turns import collect, of_kind, wait_until
from tests.tools.fake_kube import FakeKube

pytestmark = pytest.mark.slow

NAMESPACE = "agentmesh-sandbox"
CLAIM = "agentmesh-workspaces"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
# What a tools service may do in the sandbox namespace for its MCP server pods (and its Jobs).
GRANTED = {("create", "pods"), ("get", "pods"), ("list", "pods"), ("watch", "pods"), ("delete", "pods"),
           ("create", "pods/attach"), ("get", "pods/log"), ("create", "jobs"), ("get", "jobs"), ("delete", "jobs")}


def time_entry(**extra) -> dict:
    """mcp-server-time as an image would hold it; the fake's kubelet runs the command here."""
    return {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            "image": "ghcr.io/example/mcp-server-time:2026.10", **extra}


@pytest.fixture
def kube(home):
    with FakeKube(volumes={CLAIM: home / "home" / "workspaces"}) as fake:
        yield fake


def kube_env(kube: FakeKube, home: Path, servers: dict | None = None, **extra) -> dict[str, str]:
    (home / "home").mkdir(parents=True, exist_ok=True)
    env = {
        "AGENTMESH_SANDBOX": "kubernetes",
        "KUBECONFIG": str(kube.kubeconfig(home)),
        "AGENTMESH_SANDBOX_NAMESPACE": NAMESPACE,
        "AGENTMESH_SANDBOX_WORKSPACE_PVC": CLAIM,
        "AGENTMESH_SANDBOX_START_TIMEOUT_S": "15",
    }
    if servers is not None:
        env["AGENTMESH_MCP_SERVERS"] = write_servers(home / "mcp.json", servers)
    env.update(extra)
    return env


def server_pods(kube: FakeKube) -> list[dict]:
    with kube.cond:
        return [json.loads(json.dumps(p)) for p in kube.pods.values()
                if p["metadata"]["labels"].get("app.kubernetes.io/component") == "mcp-server"]


def running_server_pods(kube: FakeKube) -> list[str]:
    with kube.cond:
        return [name for (_, name), proc in kube.procs.items() if proc.poll() is None and name.startswith("agentmesh-mcp-")]


async def execute(stack, name: str, arguments: dict, timeout_s: float = 0.0):
    request = tools_service_pb2.ExecuteRequest(session_id="s1", call_id="c1", name=name, arguments_json=json.dumps(arguments),
                                       timeout_s=timeout_s)
    return (await stack.tools_stub().Execute(request, timeout=60)).result


async def test_the_model_calls_the_time_server_running_as_a_pod(home, kube, llm):
    llm.add(reply("", tool_call("time__get_current_time", {"timezone": "Europe/Paris"})), reply("It is late."))
    env = kube_env(kube, home, {"time": time_entry()})
    async with Stack(home / "home", llm_base_url=llm.base_url, env=env) as stack:
        request = gateway_pb2.ChatRequest(session_id="clock", message="What time is it in Paris?")
        events = await collect(stack.gateway_stub().Chat(request, timeout=60))
        [pod] = server_pods(kube)
        pids = [proc.pid for proc in kube.procs.values()]

    results = [e.result for e in of_kind(events, "tool_result")]
    assert len(results) == 1 and not results[0].is_error, results
    answer = json.loads(results[0].output)
    assert answer["timezone"] == "Europe/Paris" and "datetime" in answer
    assert of_kind(events, "run_finished")[0].final_text == "It is late."
    tool_messages = [m for m in llm.requests[1].body["messages"] if m["role"] == "tool"]
    assert "Europe/Paris" in tool_messages[0]["content"]

    # The server ran in a pod of its own (never in the service: its process is the fake kubelet's
    # child), reached through pods/attach on the v5 channel protocol.
    assert os.getpid() not in pids and kube.attaches == ["v5.channel.k8s.io"]
    assert kube.invalid == []  # every object sent is valid against the Kubernetes schema
    spec = pod["spec"]
    container = spec["containers"][0]
    assert container["image"] == "ghcr.io/example/mcp-server-time:2026.10"
    assert container["command"] == [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
    assert container["stdin"] is True and container["stdinOnce"] is True and container["tty"] is False
    # Hardened like the sandbox's Job pods.
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == (os.getuid() or 65534)
    hardening = container["securityContext"]
    assert hardening["readOnlyRootFilesystem"] is True and hardening["allowPrivilegeEscalation"] is False
    assert hardening["capabilities"] == {"drop": ["ALL"]} and hardening["seccompProfile"] == {"type": "RuntimeDefault"}
    # A long-lived server reserves less than a call's pod: AGENTMESH_SANDBOX_MCP_*_LIMIT.
    assert container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"] == "256Mi"
    assert container["resources"]["limits"]["cpu"] == "500m" and container["resources"]["requests"]["cpu"] == "100m"
    assert not [v for v in spec["volumes"] if {"secret", "projected", "persistentVolumeClaim"} & set(v)]
    assert not [e for e in container["env"] if e["name"].startswith("AGENTMESH") or e["name"] == "TRACEPARENT"]
    labels = pod["metadata"]["labels"]
    assert labels["agentmesh.io/mcp-server"] == "time" and labels["agentmesh.io/egress"] == "deny"
    assert labels["app.kubernetes.io/managed-by"] == "agentmesh-tools" and "agentmesh.io/mcp-owner" in labels
    # Only calls the chart's Role grants; the pod is deleted when the service stops.
    assert set(kube.requests) <= GRANTED, set(kube.requests) - GRANTED
    assert ("create", "pods/attach") in kube.requests and kube.forbidden == []
    assert server_pods(kube) == [] and running_server_pods(kube) == []


async def test_an_api_server_that_speaks_only_the_v4_channel_protocol_serves_too(home, kube):
    kube.attach_protocols = ("v4.channel.k8s.io",)  # API servers before 1.30
    async with Stack(home / "home", env=kube_env(kube, home, {"time": time_entry()}), services=("memory", "tools")) as stack:
        result = await execute(stack, "time__get_current_time", {"timezone": "Asia/Tokyo"})
    assert not result.is_error and json.loads(result.output)["timezone"] == "Asia/Tokyo", result.output
    assert kube.attaches == ["v4.channel.k8s.io"] and server_pods(kube) == []


async def test_the_trace_context_travels_in_each_call_not_in_the_pod(home, kube):
    """A long-lived server serves many traces: its pod has no TRACEPARENT; each call's _meta carries one."""
    env = kube_env(kube, home, {"time": time_entry(network=True, env={"TZ_HINT": "x-${AGENTMESH_MCP_SECRET_TIME}"})},
                   AGENTMESH_MCP_SECRET_TIME="s3cret", AGENTMESH_TRACES="local")
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        assert not (await execute(stack, "time__get_current_time", {"timezone": "UTC"})).is_error
        [pod] = server_pods(kube)
    container = pod["spec"]["containers"][0]
    assert {"name": "TZ_HINT", "value": "x-s3cret"} in container["env"]  # the entry's secret reference, resolved
    assert pod["metadata"]["labels"]["agentmesh.io/egress"] == "allow"  # "network": true


async def test_a_dead_server_pod_is_replaced_and_an_idle_one_deleted(home, kube):
    env = kube_env(kube, home, {"time": time_entry()}, AGENTMESH_MCP_PING_INTERVAL_S="0.2", AGENTMESH_MCP_IDLE_S="3")
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        assert not (await execute(stack, "time__get_current_time", {"timezone": "UTC"})).is_error
        [first] = running_server_pods(kube)
        with kube.cond:
            os.kill(kube.procs[(NAMESPACE, first)].pid, signal.SIGKILL)
        # The pod ends; the supervisor deletes it and, after its backoff, starts a fresh one.
        await wait_until(lambda: running_server_pods(kube) not in ([], [first]))
        async for _ in polling(0.25):
            result = await execute(stack, "time__get_current_time", {"timezone": "UTC"})
            if not result.is_error:
                break
            assert result.error_kind == "unavailable", result.output
        assert not result.is_error, result.output
        assert [p["metadata"]["name"] for p in server_pods(kube)] != [first]
        assert first not in [p["metadata"]["name"] for p in server_pods(kube)]  # the dead one was deleted
        # Idle past AGENTMESH_MCP_IDLE_S: the pod is deleted, the tools stay listed, and the
        # next call starts a pod again.
        await wait_until(lambda: server_pods(kube) == [])
        listed = await stack.tools_stub().ListTools(tools_pb2.ListToolsRequest())
        assert "time__get_current_time" in [t.name for t in listed.tools]
        assert not (await execute(stack, "time__get_current_time", {"timezone": "UTC"})).is_error
        assert len(running_server_pods(kube)) == 1
    assert server_pods(kube) == []


async def start_error(home, env) -> Exception:
    stack = Stack(home / "home", env=env, services=("memory", "tools"))
    try:
        with pytest.raises(ConfigError) as info:
            await stack.start()
    finally:
        await stack.stop()
    return info.value


@pytest.mark.parametrize("entry, words", [
    (time_entry(image="registry.invalid/example/mcp-server-time:1"),
     ["'time'", "image could not be pulled (ImagePullBackOff)", "registry.invalid/example/mcp-server-time:1"]),
    ({"command": "mcp-server-nowhere"}, ["'time'", "StartError", 'exec: "mcp-server-nowhere": executable file not found']),
    ({"command": sys.executable, "args": ["-c", "import sys; sys.exit('no token configured')"]},
     ["'time'", "exit code 1", "no token configured"]),
    ({"command": sys.executable, "mounts": ["/usr"]}, ["'mounts' binds host directories into the local jail"]),
    ({"command": sys.executable, "image": "not an image"}, ["is not an image reference"]),
])
async def test_a_server_that_cannot_run_stops_the_service_at_start(home, kube, entry, words):
    error = str(await start_error(home, kube_env(kube, home, {"time": entry})))
    for word in words:
        assert word in error, error
    assert server_pods(kube) == []  # nothing left behind


async def test_a_pod_that_cannot_be_scheduled_is_unavailable_not_fatal(home, kube):
    env = kube_env(kube, home, {"time": time_entry()}, AGENTMESH_SANDBOX_MCP_MEMORY_LIMIT="100Ti",
                   AGENTMESH_SANDBOX_START_TIMEOUT_S="1", AGENTMESH_MCP_CONNECT_TIMEOUT_S="1")
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        result = await execute(stack, "time__get_current_time", {"timezone": "UTC"}, timeout_s=5)
        assert result.is_error and result.error_kind == "unavailable", result.output
        assert "no node could run its pod" in result.output and "Insufficient memory" in result.output


async def test_a_namespaces_stdio_server_runs_as_a_pod_and_a_bad_one_is_refused(home, kube, llm):
    env = kube_env(kube, home, AGENTMESH_AUTH_TOKENS=TOKEN)
    async with Stack(home / "home", llm_base_url=llm.base_url, env=env) as stack:
        gateway = stack.gateway_stub()
        request = tools_pb2.AddMcpServerRequest(namespace="team-a", server=tools_pb2.McpServerSpec(
            name="clock", command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"]))
        status = await gateway.AddMcpServer(request, metadata=AUTH, timeout=90)
        assert status.available and "clock__get_current_time" in status.tools, status
        [pod] = server_pods(kube)
        labels = pod["metadata"]["labels"]
        assert labels["agentmesh.io/mcp-namespace"] == "team-a" and labels["agentmesh.io/egress"] == "deny"
        assert pod["spec"]["containers"][0]["image"] == "python:3.12-slim"  # API entries run the sandbox image

        # A command the image does not have: a clear error on add, and nothing kept.
        bad = tools_pb2.AddMcpServerRequest(namespace="team-a", server=tools_pb2.McpServerSpec(name="ghost", command="mcp-ghost"))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gateway.AddMcpServer(bad, metadata=AUTH, timeout=90)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert 'exec: "mcp-ghost": executable file not found' in info.value.details()
        listed = await gateway.ListMcpServers(tools_pb2.ListMcpServersRequest(namespace="team-a"), metadata=AUTH)
        assert [s.server.name for s in listed.servers] == ["clock"]
        assert len(server_pods(kube)) == 1

        await gateway.RemoveMcpServer(tools_pb2.RemoveMcpServerRequest(namespace="team-a", name="clock"), metadata=AUTH)
        assert server_pods(kube) == []


def phase(kube: FakeKube, name: str) -> str:
    with kube.cond:
        pod = kube.pods.get((NAMESPACE, name))
        return pod["status"].get("phase", "") if pod else ""


def post_pod(kube: FakeKube, name: str, owner: str, command: list[str]) -> None:
    """A server pod as another tools service (or an earlier run) made it."""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "mcp-server",
                                                  "app.kubernetes.io/managed-by": "agentmesh-tools",
                                                  "agentmesh.io/mcp-owner": owner}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "server", "image": "python:3.12-slim",
                                                              "command": command, "stdin": True, "stdinOnce": True}]}}
    httpx.post(f"{kube.url}/api/v1/namespaces/{NAMESPACE}/pods", json=body).raise_for_status()


async def test_a_restarted_service_removes_the_pods_an_earlier_run_left(home, kube):
    (home / "home").mkdir(parents=True, exist_ok=True)
    ours = owner_name(home / "home" / "mcp")
    post_pod(kube, "agentmesh-mcp-ended", "another-replica", ["/bin/true"])  # its server saw end of input and exited
    post_pod(kube, "agentmesh-mcp-mine", ours, ["/bin/sleep", "60"])  # ours, from before a restart
    post_pod(kube, "agentmesh-mcp-theirs", "another-replica", ["/bin/sleep", "60"])  # a live replica's
    await wait_until(lambda: len(running_server_pods(kube)) == 2 and phase(kube, "agentmesh-mcp-ended") == "Succeeded")
    async with Stack(home / "home", env=kube_env(kube, home), services=("memory", "tools")):
        assert [p["metadata"]["name"] for p in server_pods(kube)] == ["agentmesh-mcp-theirs"]


async def test_an_api_server_that_refuses_the_service_stops_it_at_start(home, kube):
    kube.fail_next = [403, 403]  # the leftovers' list (a warning), then the pod's create
    error = str(await start_error(home, kube_env(kube, home, {"time": time_entry()})))
    assert "refused the tools service (403)" in error and "create/get on pods/attach" in error, error


@pytest.mark.kubernetes
@pytest.mark.skipif(not (os.environ.get("KUBECONFIG") and os.environ.get("AGENTMESH_TEST_MCP_TIME_IMAGE")),
                    reason="needs KUBECONFIG and AGENTMESH_TEST_MCP_TIME_IMAGE (an image whose PATH has mcp-server-time)")
async def test_the_time_server_as_a_pod_of_a_real_cluster(home):
    """The same through a real API server and kubelet: AGENTMESH_SANDBOX_NAMESPACE (and the rest of
    AGENTMESH_SANDBOX_*) from the environment, as for the executor's real-cluster tests."""
    from kubernetes import client, config

    (home / "home").mkdir(parents=True, exist_ok=True)
    namespace = os.environ.get("AGENTMESH_SANDBOX_NAMESPACE", NAMESPACE)
    entry = {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "image": os.environ["AGENTMESH_TEST_MCP_TIME_IMAGE"]}
    env = {"AGENTMESH_SANDBOX": "kubernetes", "KUBECONFIG": os.environ["KUBECONFIG"], "AGENTMESH_SANDBOX_NAMESPACE": namespace,
           "AGENTMESH_SANDBOX_START_TIMEOUT_S": "180",
           "AGENTMESH_MCP_SERVERS": write_servers(home / "mcp.json", {"time": entry})}
    async with Stack(home / "home", env=env, services=("memory", "tools")) as stack:
        result = await execute(stack, "time__get_current_time", {"timezone": "Europe/Paris"}, timeout_s=60)
        assert not result.is_error and json.loads(result.output)["timezone"] == "Europe/Paris", result.output
    api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=mcp-server")
        assert [p.metadata.name for p in pods.items if not p.metadata.deletion_timestamp] == []
    finally:
        api.close()
