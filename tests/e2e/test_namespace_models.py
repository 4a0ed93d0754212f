"""A namespace's own models (NamespaceSettings.models, what ModelConfig resources become): listed
by ListModels with the namespace, usable by that namespace's turns only — the model server sees
the model's id and the key of the namespace's mounted Secret as its bearer — never the key in
recorded model calls or logs; an edit takes effect on the next turn, removal refuses the name."""

from __future__ import annotations

import json

import grpc
import pytest

from agentmesh.logs import get_logger
from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error
from tests.observability.obs_helpers import capture_logs
from tests.support.llm_server import ScriptedLLMServer, reply
from tests.support.stack import Stack

KEY = "sk-team-a-own-key-0123456789"
ROTATED = "sk-team-a-rotated-9876543210"


@pytest.fixture
def own():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm):
    secrets = tmp_path / "model-secrets"
    (secrets / "team-a" / "own-llm").mkdir(parents=True)
    (secrets / "team-a" / "own-llm" / "api-key").write_text(KEY + "\n")
    env = {"AGENTMESH_MODEL_SECRETS_DIR": str(secrets), "AGENTMESH_AGENT_RECORD_MODEL_CALLS": "true",
           "AGENTMESH_AGENT_RECALL_K": "0"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        running.secrets = secrets
        yield running


def own_model(server, **fields) -> sessions_pb2.NamespaceModel:
    return sessions_pb2.NamespaceModel(**{"name": "own", "provider": "openai", "base_url": server.base_url,
                                          "model": "own-model-v1", "api_key_secret": "own-llm",
                                          "api_key_secret_key": "api-key", "context_window": 65536, **fields})


async def set_models(gateway, namespace: str, *models) -> sessions_pb2.NamespaceSettings:
    return await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace=namespace, models=sessions_pb2.NamespaceModels(models=models)), timeout=10)


async def test_a_namespace_model_is_listed_used_with_its_mounted_key_and_masked(stack, llm, own):
    gateway = stack.gateway_stub()
    with capture_logs("agent", level="info") as logs:
        await set_models(gateway, "team-a", own_model(own))
        listed = await gateway.ListModels(gateway_pb2.ListModelsRequest(namespace="team-a"), timeout=10)
        assert [(m.name, m.namespace) for m in listed.models] == [("default", ""), ("own", "team-a")]
        assert listed.models[1].model == "own-model-v1" and listed.models[1].context_window == 65536
        deployment = await gateway.ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
        assert [m.name for m in deployment.models] == ["default"]

        await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="own-1", namespace="team-a"))
        own.add(reply("from the namespace's model"))
        events = await chat(gateway, "own-1", f"is {KEY} yours?", model="own")
        assert of_kind(events, "run_finished")[0].final_text == "from the namespace's model"
        sent = own.requests[-1]
        assert sent.body["model"] == "own-model-v1"
        assert sent.headers["authorization"] == f"Bearer {KEY}"
        assert llm.requests == []

        # The key is not in the recorded model call, though the user pasted it.
        calls = (await gateway.ListModelCalls(sessions_pb2.ListModelCallsRequest(session_id="own-1"), timeout=10)).calls
        assert calls and all(KEY not in c.request_json + c.response_json for c in calls)
        assert "[redacted]" in json.loads(calls[0].request_json)["messages"][-1]["content"]
        # Nor in a log line that carries it.
        get_logger("agentmesh.test").warning("a line with the key", detail=f"key={KEY}")
    assert KEY not in logs.text and "a line with the key" in logs.text

    # The command line lists it with its namespace.
    from tests.e2e.test_auth_and_cli import run_cli

    code, out, err = await run_cli(stack, "models", "--namespace", "team-a")
    assert code == 0, err
    assert out.splitlines()[2].split()[:4] == ["own", "(team-a)", "openai", "own-model-v1"]
    code, out, err = await run_cli(stack, "models", "--json", "--namespace", "team-a")
    assert [(m["name"], m["namespace"]) for m in json.loads(out)] == [("default", ""), ("own", "team-a")]

    # A session of the namespace may be switched to it; one of another namespace may not.
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="own-2", namespace="team-a"))
    await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(session_id="own-2", model="own"), timeout=10)
    own.add(reply("switched"))
    assert of_kind(await chat(gateway, "own-2", "hello"), "run_finished")[0].final_text == "switched"
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="b-2", namespace="team-b"))
    foreign = await rpc_error(gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(session_id="b-2", model="own")))
    assert foreign.code() == grpc.StatusCode.INVALID_ARGUMENT and "'own' is not a model" in foreign.details()

    # A rotated Secret and an edited entry are used from the next turn on.
    (stack.secrets / "team-a" / "own-llm" / "api-key").write_text(ROTATED)
    await set_models(gateway, "team-a", own_model(own, model="own-model-v2"))
    own.add(reply("edited"))
    await chat(gateway, "own-1", "again", model="own")
    assert own.requests[-1].body["model"] == "own-model-v2"
    assert own.requests[-1].headers["authorization"] == f"Bearer {ROTATED}"


async def test_another_namespace_cannot_use_it_and_removal_refuses_it(stack, llm, own):
    gateway = stack.gateway_stub()
    await set_models(gateway, "team-a", own_model(own))
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="b-1", namespace="team-b"))
    err = await rpc_error(chat(gateway, "b-1", "hi", model="own"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'own' is not a model this deployment offers" in err.details()
    listed = await gateway.ListModels(gateway_pb2.ListModelsRequest(namespace="team-b"), timeout=10)
    assert [m.name for m in listed.models] == ["default"]

    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a-1", namespace="team-a"))
    await set_models(gateway, "team-a")
    err = await rpc_error(chat(gateway, "a-1", "hi", model="own"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert own.requests == [] and llm.requests == []
    # Other settings stay: a namespace's models change only when the request carries them.
    await set_models(gateway, "team-a", own_model(own))
    await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(namespace="team-a"), timeout=10)
    settings = await gateway.GetNamespaceSettings(sessions_pb2.GetNamespaceSettingsRequest(namespace="team-a"))
    assert [m.name for m in settings.models] == ["own"]


async def test_bad_namespace_models_are_refused_and_change_nothing(stack, own):
    gateway = stack.gateway_stub()
    taken = await rpc_error(set_models(gateway, "team-a", own_model(own, name="default")))
    assert taken.code() == grpc.StatusCode.INVALID_ARGUMENT and "model of the deployment" in taken.details()
    no_key_name = await rpc_error(set_models(gateway, "team-a", own_model(own, api_key_secret_key="../x")))
    assert no_key_name.code() == grpc.StatusCode.INVALID_ARGUMENT and "api_key_secret" in no_key_name.details()
    provider = await rpc_error(set_models(gateway, "team-a", own_model(own, provider="azure")))
    assert "provider must be openai or anthropic" in provider.details()
    settings = await gateway.GetNamespaceSettings(sessions_pb2.GetNamespaceSettingsRequest(namespace="team-a"))
    assert list(settings.models) == []


async def test_a_key_not_mounted_fails_the_turn_with_a_sentence(stack, own):
    gateway = stack.gateway_stub()
    await set_models(gateway, "team-a", own_model(own, api_key_secret="missing"))
    await gateway.CreateSession(gateway_pb2.CreateSessionRequest(session_id="a-2", namespace="team-a"))
    err = await rpc_error(chat(gateway, "a-2", "hi", model="own"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Secret 'missing', which is not mounted for the agent" in err.details()
    assert own.requests == []
