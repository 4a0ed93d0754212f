"""`models` becomes the AGENTMESH_MODELS file of the agent and the gateway; keys come from Secrets
into the agent's environment only, never into the file; the agent may reach each model's port."""

from __future__ import annotations

import json

import helm_python
import pytest

from agentmesh.models import load_model_file
from tests.helm.helm_support import RELEASE, allowed, container_env, external, pod, render

MODELS = [
    {"name": "small", "provider": "openai", "base_url": "http://ollama.ollama:11434/v1", "model": "llama3.1:8b",
     "context_window": 131072, "prices": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}, "temperature": 0.2,
     "text_tool_calls": True, "fallback": "default"},
    {"name": "big", "provider": "anthropic", "base_url": "https://api.anthropic.com/v1", "model": "claude-x",
     "apiKeySecret": {"name": "model-keys", "key": "anthropic"}},
]


def spec(rendered, service: str) -> dict:
    return rendered.deployment(service)["spec"]["template"]["spec"]


def test_models_become_a_file_for_the_agent_and_the_gateway_with_keys_from_secrets(tmp_path):
    rendered = render({"models": MODELS})
    data = json.loads(rendered.get("ConfigMap", f"{RELEASE}-models")["data"]["models.json"])
    assert data["models"][0] == MODELS[0]
    big = data["models"][1]
    assert "apiKeySecret" not in big and big["api_key_env"] == "AGENTMESH_MODEL_KEY_1"

    for service in ("agent", "gateway"):
        [container] = spec(rendered, service)["containers"]
        env = container_env(container)
        mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
        assert env["AGENTMESH_MODELS"] == mount["mountPath"] + "/models.json" and mount["readOnly"]
    agent_env = container_env(spec(rendered, "agent")["containers"][0])
    assert agent_env["AGENTMESH_MODEL_KEY_1"] == {"secretKeyRef": {"name": "model-keys", "key": "anthropic"}}
    assert "AGENTMESH_MODEL_KEY_1" not in container_env(spec(rendered, "gateway")["containers"][0])
    for service in ("tools", "memory", "scheduler"):
        assert "AGENTMESH_MODELS" not in container_env(spec(rendered, service)["containers"][0])

    # The file is one the services load as it is, the key read from the variable it names.
    path = tmp_path / "models.json"
    path.write_text(json.dumps(data))
    loaded = load_model_file(str(path), {"AGENTMESH_MODEL_KEY_1": "sk-from-secret"})
    assert loaded["big"].api_key == "sk-from-secret" and loaded["small"].text_tool_calls


def test_the_agent_may_reach_each_models_port():
    rendered = render({"models": MODELS, "llm": {"provider": "scripted"}})
    policies = rendered.kind("NetworkPolicy")
    workload = rendered.deployment("agent")
    agent = pod("agent", workload["metadata"]["namespace"], workload["spec"]["template"]["metadata"]["labels"])
    server = external("model", "203.0.113.10")
    assert allowed(policies, agent, server, 11434) and allowed(policies, agent, server, 443)
    assert not allowed(policies, agent, server, 8443)


def test_no_models_renders_nothing_for_them():
    rendered = render()
    assert rendered.find("ConfigMap", f"{RELEASE}-models") is None
    assert "AGENTMESH_MODELS" not in container_env(spec(rendered, "agent")["containers"][0])


@pytest.mark.parametrize("model", [
    {"name": "default", "base_url": "http://x/v1", "model": "m"},
    {"name": "m", "base_url": "http://x/v1", "model": "m", "api_key": "sk-inline"},
    {"name": "m", "base_url": "ftp://x", "model": "m"},
    {"name": "m", "base_url": "http://x/v1", "model": "m", "apiKeySecret": {"name": "s"}},
])
def test_the_schema_refuses_what_the_service_would_and_inline_keys(model):
    with pytest.raises(helm_python.HelmError):
        render({"models": [model]})


def test_the_default_models_prices_reach_every_service():
    rendered = render({"llm": {"provider": "scripted", "prices": {"inputPerMtok": 2.5, "outputPerMtok": 10}}})
    data = rendered.get("ConfigMap", f"{RELEASE}-config")["data"]
    assert (data["AGENTMESH_LLM_INPUT_PRICE_PER_MTOK"], data["AGENTMESH_LLM_OUTPUT_PRICE_PER_MTOK"]) == ("2.5", "10")
