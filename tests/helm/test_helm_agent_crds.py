"""The chart's `Agent` CRD against the documented shape: every `kind: Agent` example of
docs/agents.md is valid under the CRD's OpenAPI schema as the chart renders it, uses only fields
the schema declares (what `kubectl apply`'s strict field validation asks), and is the same file
`agentmesh agents create -f` reads; what `agents show` prints back validates too, so it can be
applied as it is. The status subresource and the printer columns are the ones the docs show."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml

from agentmesh.agent_manifest import document_of, spec_from_document
from agentmesh.v1 import agents_pb2
from tests.helm.helm_support import render
from tests.support.crd_schema import undeclared

DOCS = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def docs_manifests() -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), flags=re.S)
    documents = [yaml.safe_load(block) for block in blocks]
    return [d for d in documents if isinstance(d, dict) and d.get("kind") == "Agent"]


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return render().get("CustomResourceDefinition", "agents.agentmesh.dev")


def test_the_docs_examples_are_valid_agents_the_cli_reads_too(crd):
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    examples = docs_manifests()
    assert len(examples) >= 2  # the definition and the GitOps one
    for example in examples:
        jsonschema.validate(example, schema)
        assert undeclared(example, schema) == []
        name = example["metadata"]["name"]
        _, spec = spec_from_document(example)
        assert spec.name == name and spec.instructions.strip()
        # `agents show` prints it back in a form that validates again, field for field.
        shown = document_of(agents_pb2.AgentInfo(namespace="team-a", spec=spec))
        jsonschema.validate(shown, schema)
        assert undeclared(shown, schema) == []
        assert spec_from_document(shown)[1] == spec


def test_a_malformed_agent_is_refused_by_the_schema(crd):
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    good = docs_manifests()[0]
    for path, bad in ((("spec", "tools", "permissionMode"), "sometimes"), (("spec", "budgets", "steps"), -1),
                      (("spec", "instructions"), "")):
        manifest = yaml.safe_load(yaml.safe_dump(good))
        target = manifest
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(manifest, schema)


def test_kubectl_get_agents_prints_the_documented_columns_from_the_status_subresource(crd):
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Ready", "Reason", "Model", "Version", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"observedGeneration", "version", "conditions"} <= set(status)


def test_the_docs_model_configs_are_valid_and_what_the_controller_stores():
    """The ModelConfig examples validate under its CRD, use declared fields only, and are entries
    the controller stores (services/scheduler/model_resources.py), the key by reference."""
    from agentmesh.scheduler.model_resources import entry_of

    schema = render().get("CustomResourceDefinition", "modelconfigs.agentmesh.dev")["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"]
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), flags=re.S)]
    examples = [d for d in blocks if isinstance(d, dict) and d.get("kind") == "ModelConfig"]
    assert examples
    for example in examples:
        jsonschema.validate(example, schema)
        assert undeclared(example, schema) == []
        entry = entry_of(example["metadata"]["name"], example["spec"])
        assert (entry["api_key_secret"], entry["api_key_secret_key"]) == (
            example["spec"]["apiKeySecret"]["name"], example["spec"]["apiKeySecret"]["key"])


def test_model_secrets_are_one_projected_directory_of_the_agent_pods_only():
    """Where the agent reads a ModelConfig's key: <namespace>/<secret>/<key> under AGENTMESH_MODEL_SECRETS_DIR."""
    from tests.helm.helm_support import container_env

    rendered = render({"agent": {"modelSecrets": [{"namespace": "team-a", "secretName": "team-llm", "keys": ["api-key"]}]}})
    agent = rendered.deployment("agent")["spec"]["template"]["spec"]
    [container] = agent["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "model-secrets")
    assert container_env(container)["AGENTMESH_MODEL_SECRETS_DIR"] == mount["mountPath"] and mount["readOnly"]
    volume = next(v for v in agent["volumes"] if v["name"] == "model-secrets")
    assert volume["projected"]["sources"] == [
        {"secret": {"name": "team-llm", "items": [{"key": "api-key", "path": "team-a/team-llm/api-key"}]}}]
    for service in ("gateway", "tools", "memory", "scheduler"):
        spec = rendered.deployment(service)["spec"]["template"]["spec"]
        assert "model-secrets" not in {v["name"] for v in spec.get("volumes") or []}


@pytest.mark.parametrize("secrets", [[{"namespace": "team-a", "secretName": "x"}],
                                     [{"namespace": "team-a", "secretName": "x", "keys": [".."]}],
                                     [{"namespace": "team-a", "secretName": "../x", "keys": ["k"]}]])
def test_the_schema_refuses_model_secrets_it_cannot_mount(secrets):
    with pytest.raises(helm_python.HelmError):
        render({"agent": {"modelSecrets": secrets}})
