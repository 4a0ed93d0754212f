"""Named models (AGENTMESH_MODELS): listed by the gateway, chosen per turn, validated, and a
failing model falls back — each model a scripted server of its own, over real HTTP."""

from __future__ import annotations

import grpc
import pytest

from agentmesh.v1 import gateway_pb2, sessions_pb2
from tests.e2e.conftest import chat, of_kind, rpc_error
from tests.support.llm_server import ScriptedLLMServer, failure, reply
from tests.support.stack import Stack


@pytest.fixture
def second():
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def flaky():
    with ScriptedLLMServer(default=failure(503)) as server:
        yield server


@pytest.fixture
async def stack(tmp_path, llm, second, flaky):
    catalog = tmp_path / "models.yaml"
    catalog.write_text(f"""
models:
  - name: second
    provider: openai
    base_url: {second.base_url}
    model: second-model
    api_key_env: SECOND_KEY
    context_window: 32768
    vision: true
    prices: {{input_per_mtok: 0.5, output_per_mtok: 1.5}}
    max_output_tokens: 512
  - name: flaky
    base_url: {flaky.base_url}
    model: flaky-model
    fallback: second
""")
    env = {"AGENTMESH_MODELS": str(catalog), "SECOND_KEY": "sk-second", "AGENTMESH_LLM_MAX_RETRIES": "1",
           "AGENTMESH_LLM_MODEL": "main-model", "AGENTMESH_COMPACTION_MODEL": "second"}
    async with Stack(tmp_path / "home", llm_base_url=llm.base_url, env=env) as running:
        yield running


async def test_models_are_listed_and_a_turn_goes_to_the_model_it_names(stack, llm, second):
    gateway = stack.gateway_stub()
    listing = await gateway.ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
    assert [(m.name, m.model, m.is_default) for m in listing.models] == [
        ("default", "main-model", True), ("flaky", "flaky-model", False), ("second", "second-model", False)]
    info = {m.name: m for m in listing.models}["second"]
    assert (info.context_window, info.input_price_per_mtok, info.output_price_per_mtok) == (32768, 0.5, 1.5)
    # The roles: every model chats and reflects on its own sessions; "second" compacts for all.
    assert (not info.no_vision, list(info.roles)) == (True, ["chat", "compaction", "reflection (own)"])
    assert list({m.name: m for m in listing.models}["default"].roles) == ["chat", "reflection (own)"]

    llm.add(reply("from the default model"))
    second.add(reply("from the second model"))
    assert of_kind(await chat(gateway, "m", "hi"), "run_finished")[0].final_text == "from the default model"
    events = await chat(gateway, "m", "and you?", model="second")
    assert of_kind(events, "run_finished")[0].final_text == "from the second model"

    (request,) = second.requests
    assert request.body["model"] == "second-model" and request.body["max_tokens"] == 512
    assert request.headers["authorization"] == "Bearer sk-second"
    # The second model sees the whole conversation, the default model's answer included.
    assert [m["content"] for m in request.body["messages"] if m["role"] != "system"] == [
        "hi", "from the default model", "and you?"]
    assert len(llm.requests) == 1 and llm.requests[0].body["model"] == "main-model"


async def test_an_unknown_model_is_refused_naming_the_known_ones(stack, llm):
    err = await rpc_error(chat(stack.gateway_stub(), "m", "hi", model="gpt-9"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'gpt-9' is not a model this deployment offers; known models: default, flaky, second" in err.details()
    assert llm.requests == []


async def test_a_failing_model_falls_back_and_says_so(stack, llm, second, flaky):
    second.add(reply("the fallback answered"))
    events = await chat(stack.gateway_stub(), "fb", "hi", model="flaky")
    assert of_kind(events, "run_finished")[0].final_text == "the fallback answered"
    notes = [s.message for s in of_kind(events, "status")]
    assert any("model 'flaky' failed" in n and "falling back to 'second'" in n for n in notes), notes
    assert len(flaky.requests) == 2  # the first try and its one retry
    assert second.requests[0].body["model"] == "second-model"


async def test_cli_models_prints_a_table_and_json(stack):
    import json

    from tests.e2e.test_auth_and_cli import run_cli

    code, out, err = await run_cli(stack, "models")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "PROVIDER", "MODEL", "CONTEXT", "VISION", "$/MTOK", "IN", "$/MTOK", "OUT",
                                "FALLBACK", "ROLES"]
    assert lines[1].split()[:3] == ["default", "*", "openai"]
    assert lines[3].split() == ["second", "openai", "second-model", "32768", "yes", "0.5", "1.5", "-",
                                "chat,", "compaction,", "reflection", "(own)"]
    print(out)
    code, out, err = await run_cli(stack, "models", "--json")
    assert code == 0, err
    second = {m["name"]: m for m in json.loads(out)}["second"]
    assert second["context_window"] == 32768 and second["output_price_per_mtok"] == 1.5


async def test_a_session_switched_to_another_model_sends_its_next_request_there(stack, llm, second):
    from tests.e2e.test_auth_and_cli import run_cli

    gateway = stack.gateway_stub()
    llm.add(reply("default here"))
    await chat(gateway, "sw", "first")

    err = await rpc_error(gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(session_id="sw", model="gpt-9"),
                                                timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "known models: default, flaky, second" in err.details()
    err = await rpc_error(gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(session_id="ghost", model="second"),
                                                timeout=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    code, out, err_text = await run_cli(stack, "sessions", "set-model", "sw", "second")
    assert code == 0, err_text
    assert "now uses model second" in out
    assert (await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="sw"), timeout=10)).model == "second"

    second.add(reply("second here"))
    events = await chat(gateway, "sw", "next")
    assert of_kind(events, "run_finished")[0].final_text == "second here"
    assert [r.body["model"] for r in second.requests] == ["second-model"]
    assert len(llm.requests) == 1
    # A turn may still name another model; going back to "" restores the default.
    await gateway.UpdateSession(sessions_pb2.UpdateSessionRequest(session_id="sw", model=""), timeout=10)
    llm.add(reply("default again"))
    assert of_kind(await chat(gateway, "sw", "again"), "run_finished")[0].final_text == "default again"
