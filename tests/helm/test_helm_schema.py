"""Bad values fail at install with a message that names what to fix; good ones render.

Types, enums and ranges are values.schema.json's job (Helm reports the JSON path); rules that
relate two values are templates/validate.yaml's (a sentence that says what to change).
"""

from __future__ import annotations

import helm_python
import pytest

from tests.helm.helm_support import CHART, render_files

SCHEMA_ERRORS = [
    ({"gatway": {"replicas": 2}}, "additional properties 'gatway' not allowed"),
    ({"llm": {"provider": "gpt"}}, "/llm/provider"),
    ({"gateway": {"replicas": "two"}}, "/gateway/replicas"),
    ({"agent": {"resources": {"requests": {"cpu": "lots"}, "limits": {"cpu": 1, "memory": "1Gi"}}}},
     "/agent/resources/requests/cpu"),
    ({"tools": {"resources": {"limits": None}}}, "/tools/resources"),
    ({"memory": {"resources": {"limits": {"cpu": None}}}}, "/memory/resources/limits"),
    ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"sandbox": {"namespace": "Not_A_Namespace"}}, "/sandbox/namespace"),
    ({"sandbox": {"workspace": {"accessModes": ["ReadWriteSometimes"]}}}, "/sandbox/workspace/accessModes"),
    ({"sandbox": {"workspace": {"quotaMB": 0}}}, "/sandbox/workspace/quotaMB"),
    ({"sandbox": {"workspace": {"quotaMB": "1Gi"}}}, "/sandbox/workspace/quotaMB"),
    ({"auth": {"tokens": ["short"]}}, "/auth/tokens/0"),
    ({"otel": {"endpoint": "collector:4317"}}, "/otel/endpoint"),
    ({"llm": {"baseUrl": "api.openai.com"}}, "/llm/baseUrl"),
    ({"gateway": {"service": {"type": "ExternalName"}}}, "/gateway/service/type"),
    ({"gateway": {"autoscaling": {"targetCPUUtilizationPercentage": 150}}}, "/gateway/autoscaling/targetCPUUtilizationPercentage"),
    ({"scheduler": {"replicas": 5}}, "/scheduler/replicas"),
    ({"scheduler": {"autoscaling": {"enabled": True}}}, "additional properties 'autoscaling' not allowed"),
    ({"networkPolicy": {"kubeApiServer": {"cidrs": ["everywhere"]}}}, "/networkPolicy/kubeApiServer/cidrs/0"),
    ({"memory": {"embeddings": {"embedder": "word2vec"}}}, "/memory/embeddings/embedder"),
    ({"gateway": {"extraEnv": [{"value": "no name"}]}}, "/gateway/extraEnv/0"),
    ({"sandbox": {"isolation": "process"}}, "/sandbox/isolation"),
    ({"sandbox": {"warmPool": {"max": -1}}}, "/sandbox/warmPool/max"),
]

RULE_ERRORS = [
    ({"qdrant": {"enabled": False}}, "externalQdrant.url"),
    ({"llm": {"provider": "openai", "model": "gpt-4o-mini"}}, "llm.baseUrl is empty"),
    ({"llm": {"provider": "anthropic", "baseUrl": "https://api.anthropic.com"}}, "llm.model is empty"),
    ({"sandbox": {"namespace": "agentmesh-sandbox"}}, "sandbox.workspace.existingClaim"),
    ({"sandbox": {"createNamespace": True}}, "name the dedicated namespace"),
    ({"gateway": {"service": {"type": "LoadBalancer"}}}, "without authentication"),
    ({"gateway": {"ingress": {"enabled": True}}}, "without authentication"),
    ({"scheduler": {"replicas": 2}}, "scheduler.replicas > 1"),
    ({"tools": {"autoscaling": {"enabled": True}}}, "ReadWriteMany workspace"),
    ({"agent": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "agent.autoscaling.minReplicas (5) is greater"),
    ({"memory": {"autoscaling": {"targetCPUUtilizationPercentage": None}}}, "memory.autoscaling.enabled needs"),
    ({"memory": {"embeddings": {"embedder": "openai"}}}, "memory.embeddings.baseUrl"),
    ({"sandbox": {"warmPool": {"min": 3, "max": 2}}}, "sandbox.warmPool.min (3) is greater"),
]


@pytest.mark.parametrize("values, fragment", SCHEMA_ERRORS, ids=[f for _, f in SCHEMA_ERRORS])
def test_the_schema_rejects_bad_values(values, fragment):
    with pytest.raises(helm_python.HelmValuesError) as caught:
        render_files(values)
    assert fragment in str(caught.value)
    # The same check runs on its own (what `helm lint` and `helm install` do first).
    with helm_python.Chart.load(str(CHART)) as chart, pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema(values)


@pytest.mark.parametrize("values, fragment", RULE_ERRORS, ids=[f for _, f in RULE_ERRORS])
def test_inconsistent_values_fail_with_a_sentence(values, fragment):
    with pytest.raises(helm_python.HelmRenderError) as caught:
        render_files(values)
    assert fragment in str(caught.value)


GOOD = [
    {"qdrant": {"enabled": False}, "externalQdrant": {"url": "https://qdrant.example.com:6333"}},
    {"llm": {"provider": "openai", "baseUrl": "http://ollama.llm:11434/v1", "model": "llama3.1"}},
    {"gateway": {"service": {"type": "LoadBalancer"}}, "auth": {"existingSecret": "gateway-tokens"}},
    {"gateway": {"service": {"type": "NodePort", "nodePort": 30051}}, "auth": {"tokens": ["a" * 24]}},
    {"sandbox": {"namespace": "sbx", "createNamespace": True, "runtimeClassName": "gvisor",
                 "workspace": {"existingClaim": "shared-ws", "accessModes": ["ReadWriteMany"]}}},
    {"tools": {"autoscaling": {"enabled": True}}, "sandbox": {"workspace": {"accessModes": ["ReadWriteMany"]}}},
    {"scheduler": {"replicas": 2, "persistence": {"enabled": False}}},
    {"image": {"digest": "sha256:" + "a" * 64}, "sandbox": {"image": {"digest": "sha256:" + "b" * 64}}},
    {"networkPolicy": {"enabled": False}},
    {"gateway": {"autoscaling": {"enabled": False}, "replicas": 1}},
]


@pytest.mark.parametrize("values", GOOD, ids=range(len(GOOD)))
def test_sound_variations_render(values):
    files = render_files(values)
    assert any("kind: Deployment" in text for text in files.values())


def test_digests_win_over_tags():
    files = render_files({"image": {"digest": "sha256:" + "a" * 64}})
    text = "\n".join(files.values())
    assert "ghcr.io/agentmesh/agentmesh@sha256:" + "a" * 64 in text
    assert "ghcr.io/agentmesh/agentmesh:0.1.0" not in text
