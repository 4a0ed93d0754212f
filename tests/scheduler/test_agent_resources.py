"""Agents as Kubernetes resources, through the real stack: the scheduler's leader watches `Agent`
resources of a managed namespace on the tests' Kubernetes API (fake_agent_api.py) and syncs them
into the namespace's agents through the gateway. Applying one makes it usable in a chat (its
system prompt reaches the model server) and Ready; a missing model is Ready=False with a reason;
deleting it removes the agent; the API refuses agent changes in that namespace."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentmesh.v1 import agents_pb2, gateway_pb2
from tests.scheduler.fake_agent_api import FakeAgentApi
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.turns import collect, wait_until


def manifest(name: str, instructions: str, **spec) -> dict:
    return {"apiVersion": "agentmesh.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"description": f"The {name}.", "instructions": instructions, **spec}}


async def agent_names(gateway, namespace: str = "team-a") -> list[str]:
    listed = await gateway.ListAgents(agents_pb2.ListAgentsRequest(namespace=namespace))
    return sorted(a.spec.name for a in listed.agents if not a.builtin)


async def eventually(check, timeout: float = 30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def reason_of(err: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(err)
    for detail in status.details if status else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""


@pytest.fixture
def kube():
    with FakeAgentApi() as api:
        yield api


async def test_an_applied_agent_is_synced_ready_usable_and_removed_with_its_resource(tmp_path, kube, monkeypatch):
    from tests.support.stack import Stack

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    env = {"AGENTMESH_MANAGED_AGENT_NAMESPACES": "team-a", "AGENTMESH_SCHEDULER_RENEW_S": "0.2"}
    with ScriptedLLMServer() as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
            gateway = stack.gateway_stub()
            kube.apply(manifest("reviewer", "You are THE REVIEWER FROM GIT.", model="default",
                                tools={"allow": ["read_file", "grep"]}, subAgents=["explore"]))
            await wait_until(lambda: (kube.ready("team-a", "reviewer") or {}).get("status") == "True", timeout=60)
            resource = kube.get("team-a", "reviewer")
            assert resource["status"]["observedGeneration"] == 1 and resource["status"]["version"] == 1
            assert resource["status"]["conditions"][0]["reason"] == "Synced"
            assert await agent_names(gateway) == ["reviewer"]

            # Usable in a chat: its instructions are the turn's system prompt, its tools the only ones.
            await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="rev-1", namespace="team-a"))
            llm.add(reply("looks fine"))
            await collect(gateway.Chat(gateway_pb2.ChatRequest(
                session_id="rev-1", message="review it", options=gateway_pb2.ChatOptions(agent="reviewer"))))
            sent = llm.requests[-1].body
            assert "You are THE REVIEWER FROM GIT." in sent["messages"][0]["content"]
            offered = {t["function"]["name"] for t in sent.get("tools") or []}
            assert {"read_file", "grep"} <= offered and "write_file" not in offered

            # One source of truth: the API refuses to define or change agents in this namespace.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="team-a", spec=agents_pb2.AgentSpec(
                    name="sideload", instructions="Not from Git.")))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert reason_of(refused.value) == "AGENTS_FROM_RESOURCES"
            assert "defined by Kubernetes Agent resources" in refused.value.details()
            with pytest.raises(grpc.aio.AioRpcError):
                await gateway.DeleteAgent(agents_pb2.DeleteAgentRequest(namespace="team-a", name="reviewer"))
            assert await agent_names(gateway) == ["reviewer"]
            # Other namespaces keep the API.
            await gateway.CreateAgent(agents_pb2.CreateAgentRequest(namespace="team-b", spec=agents_pb2.AgentSpec(
                name="helper", instructions="Help.")))

            # A model the catalogue does not have: Ready=False with the reason, and no agent.
            kube.apply(manifest("dreamer", "Dream.", model="gpt-9"))
            await wait_until(lambda: kube.ready("team-a", "dreamer") is not None, timeout=60)
            condition = kube.ready("team-a", "dreamer")
            assert (condition["status"], condition["reason"]) == ("False", "ModelNotFound")
            assert "'gpt-9'" in condition["message"] and "default" in condition["message"]
            # A sub-agent no resource and no built-in names, likewise.
            kube.apply(manifest("boss", "Delegate.", subAgents=["ghost"]))
            await wait_until(lambda: kube.ready("team-a", "boss") is not None, timeout=60)
            assert kube.ready("team-a", "boss")["reason"] == "SubAgentNotFound"
            assert await agent_names(gateway) == ["reviewer"]

            # An edit is the next version, observed at the next generation.
            kube.apply(manifest("reviewer", "You are THE SECOND REVIEWER.", model="default"))
            await wait_until(lambda: kube.get("team-a", "reviewer")["status"]["observedGeneration"] == 2, timeout=60)
            assert kube.get("team-a", "reviewer")["status"]["version"] == 2
            llm.add(reply("still fine"))
            await collect(gateway.Chat(gateway_pb2.ChatRequest(
                session_id="rev-1", message="again", options=gateway_pb2.ChatOptions(agent="reviewer"))))
            assert "You are THE SECOND REVIEWER." in llm.requests[-1].body["messages"][0]["content"]
            # Passes that find nothing changed (status writes, the other resources' events) make no version.
            versions = await gateway.ListAgentVersions(agents_pb2.ListAgentVersionsRequest(namespace="team-a",
                                                                                           name="reviewer"))
            assert [v.version for v in versions.versions] == [1, 2]

            # Deleting the resource removes the agent.
            kube.delete("team-a", "reviewer")

            async def gone() -> bool:
                return await agent_names(gateway) == []

            await eventually(gone, timeout=60)
            assert [a.spec.name for a in (await gateway.ListAgents(agents_pb2.ListAgentsRequest(
                namespace="team-b"))).agents if not a.builtin] == ["helper"]
    # Only what the chart's Role grants was asked for, and every status written was valid.
    assert kube.forbidden == [] and kube.invalid == []


async def test_under_a_tenant_policy_the_controller_acts_as_admin_of_the_namespaces_tenant(tmp_path, kube, monkeypatch):
    """No principal is in every tenant: the controller's calls are signed as admin of the tenant
    owning the namespace (as the retention sweep's), and a tenant's own admin is still refused."""
    import json

    from agentmesh.tenancy import token_digest
    from agentmesh.v1 import gateway_pb2_grpc
    from tests.support.stack import Stack

    tokens = {"a-admin": "tok-a-admin-0123456789", "b-admin": "tok-b-admin-0123456789"}
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "tenants": {"acme": {"namespaces": ["team-a"]}, "beta": {"namespaces": ["team-b"]}},
        "service_accounts": [{"name": n, "token_sha256": token_digest(t), "tenant": "acme" if n[0] == "a" else "beta",
                              "role": "admin"} for n, t in tokens.items()]}))
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    env = {"AGENTMESH_MANAGED_AGENT_NAMESPACES": "team-a", "AGENTMESH_SCHEDULER_RENEW_S": "0.2",
           "AGENTMESH_AUTH_POLICY": str(policy)}
    with ScriptedLLMServer() as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
            gateway = gateway_pb2_grpc.GatewayStub(stack.user_channel("gateway"))
            admin_a = (("authorization", f"Bearer {tokens['a-admin']}"),)
            kube.apply(manifest("reviewer", "You review.", model="default"))
            await wait_until(lambda: (kube.ready("team-a", "reviewer") or {}).get("status") == "True", timeout=60)
            listed = await gateway.ListAgents(agents_pb2.ListAgentsRequest(namespace="team-a"), metadata=admin_a)
            assert [a.spec.name for a in listed.agents if not a.builtin] == ["reviewer"]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await gateway.UpdateAgent(agents_pb2.UpdateAgentRequest(namespace="team-a", spec=agents_pb2.AgentSpec(
                    name="reviewer", instructions="Hijacked.")), metadata=admin_a)
            assert reason_of(refused.value) == "AGENTS_FROM_RESOURCES"
            # Another tenant's admin does not even see the namespace.
            with pytest.raises(grpc.aio.AioRpcError) as foreign:
                await gateway.ListAgents(agents_pb2.ListAgentsRequest(namespace="team-a"),
                                         metadata=(("authorization", f"Bearer {tokens['b-admin']}"),))
            assert foreign.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
    assert kube.forbidden == [] and kube.invalid == []
