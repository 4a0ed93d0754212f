"""ModelConfig resources through the real stack: the scheduler's leader watches them on the tests'
Kubernetes API (fake_agent_api.py) and makes them their namespace's own models. Applying one makes
it usable by a chat in that namespace — the model server sees its id and the key of the Secret
mounted for the agent as its bearer — and Ready; another namespace cannot use it; an Agent naming
it is Ready once it exists; deleting it removes the model; the key never reaches the recorded
model calls; the scheduler asks for no Secret."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.scheduler.fake_agent_api import FakeAgentApi
from tests.scheduler.test_agent_resources import eventually
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.turns import collect, wait_until

KEY = "sk-from-the-secret-0123456789"


def model_config(name: str, server, namespace: str = "team-a", **spec) -> dict:
    return {"apiVersion": "agentmesh.dev/v1alpha1", "kind": "ModelConfig",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"provider": "openai", "model": "team-model-1", "baseUrl": server.base_url,
                     "contextWindow": 32768, "apiKeySecret": {"name": "team-llm", "key": "api-key"}, **spec}}


@pytest.fixture
def kube():
    with FakeAgentApi() as api:
        yield api


@pytest.fixture
def own():
    with ScriptedLLMServer() as server:
        yield server


async def listed(gateway, namespace: str) -> list[str]:
    reply_ = await gateway.ListModels(gateway_pb2.ListModelsRequest(namespace=namespace), timeout=10)
    return [m.name for m in reply_.models]


async def test_an_applied_model_config_is_ready_usable_by_its_namespace_only_and_removed(tmp_path, kube, own,
                                                                                        monkeypatch):
    from tests.support.stack import Stack

    secrets = tmp_path / "model-secrets" / "team-a" / "team-llm"
    secrets.mkdir(parents=True)
    (secrets / "api-key").write_text(KEY + "\n")
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    env = {"AGENTMESH_MANAGED_AGENT_NAMESPACES": "team-a", "AGENTMESH_SCHEDULER_RENEW_S": "0.2",
           "AGENTMESH_MODEL_SECRETS_DIR": str(tmp_path / "model-secrets"), "AGENTMESH_AGENT_RECORD_MODEL_CALLS": "true",
           "AGENTMESH_AGENT_RECALL_K": "0"}
    with ScriptedLLMServer() as llm:
        async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as stack:
            gateway = stack.gateway_stub()
            # An Agent naming the model before it exists waits for it (ModelNotFound, then Ready).
            kube.apply({"apiVersion": "agentmesh.dev/v1alpha1", "kind": "Agent",
                        "metadata": {"name": "team-bot", "namespace": "team-a"},
                        "spec": {"instructions": "You are the team's bot.", "model": "team-model"}})
            await wait_until(lambda: kube.ready("team-a", "team-bot") is not None, timeout=60)
            assert kube.ready("team-a", "team-bot")["reason"] == "ModelNotFound"

            kube.apply(model_config("team-model", own))
            await wait_until(lambda: (kube.ready("team-a", "team-model", "modelconfigs") or {}).get("status") == "True",
                             timeout=60)
            resource = kube.get("team-a", "team-model", "modelconfigs")
            assert resource["status"]["observedGeneration"] == 1
            assert resource["status"]["conditions"][0]["reason"] == "Synced"
            assert await listed(gateway, "team-a") == ["default", "team-model"]
            await wait_until(lambda: (kube.ready("team-a", "team-bot") or {}).get("status") == "True", timeout=60)

            # A chat in the namespace names it: the request reaches its server with the mounted key.
            await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="tm-1", namespace="team-a"))
            own.add(reply("the team's model answers"))
            await collect(gateway.Chat(gateway_pb2.ChatRequest(
                session_id="tm-1", message=f"my key is {KEY}", options=gateway_pb2.ChatOptions(model="team-model"))))
            assert own.requests[-1].body["model"] == "team-model-1"
            assert own.requests[-1].headers["authorization"] == f"Bearer {KEY}"
            # And the Agent naming it uses it too.
            own.add(reply("the bot answers"))
            await collect(gateway.Chat(gateway_pb2.ChatRequest(
                session_id="tm-1", message="hi bot", options=gateway_pb2.ChatOptions(agent="team-bot"))))
            assert "You are the team's bot." in own.requests[-1].body["messages"][0]["content"]
            assert llm.requests == []
            calls = (await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="tm-1"))).calls
            assert len(calls) == 2 and all(KEY not in c.request_json + c.response_json for c in calls)

            # One source of truth: the API does not change a managed namespace's models.
            with pytest.raises(grpc.aio.AioRpcError) as sideload:
                await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
                    namespace="team-a", models=sessions_pb2.NamespaceModels()))
            assert sideload.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "defined by Kubernetes ModelConfig resources" in sideload.value.details()
            assert await listed(gateway, "team-a") == ["default", "team-model"]

            # Another namespace does not have it.
            assert await listed(gateway, "team-b") == ["default"]
            await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="tb-1", namespace="team-b"))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await collect(gateway.Chat(gateway_pb2.ChatRequest(
                    session_id="tb-1", message="hi", options=gateway_pb2.ChatOptions(model="team-model"))))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            # A spec the scheduler can tell is wrong: Ready=False with the reason.
            kube.apply(model_config("default", own))
            await wait_until(lambda: kube.ready("team-a", "default", "modelconfigs") is not None, timeout=60)
            assert kube.ready("team-a", "default", "modelconfigs")["reason"] == "NameTaken"
            kube.apply(model_config("lost", own, fallback="nowhere"))
            await wait_until(lambda: kube.ready("team-a", "lost", "modelconfigs") is not None, timeout=60)
            assert kube.ready("team-a", "lost", "modelconfigs")["reason"] == "ModelNotFound"

            # An edit is the model from the next turn on.
            kube.apply(model_config("team-model", own, model="team-model-2"))
            await wait_until(lambda: kube.get("team-a", "team-model", "modelconfigs")["status"]["observedGeneration"] == 2,
                             timeout=60)
            own.add(reply("edited"))
            await collect(gateway.Chat(gateway_pb2.ChatRequest(
                session_id="tm-1", message="again", options=gateway_pb2.ChatOptions(model="team-model"))))
            assert own.requests[-1].body["model"] == "team-model-2"

            # Deleting the resource removes the model.
            kube.delete("team-a", "team-model", "modelconfigs")

            async def gone() -> bool:
                return await listed(gateway, "team-a") == ["default"]

            await eventually(gone, timeout=60)
            with pytest.raises(grpc.aio.AioRpcError) as removed:
                await collect(gateway.Chat(gateway_pb2.ChatRequest(
                    session_id="tm-1", message="still?", options=gateway_pb2.ChatOptions(model="team-model"))))
            assert removed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Only what the chart's Role grants was asked for (no Secret), and every status written was valid.
    assert kube.forbidden == [] and kube.invalid == []
