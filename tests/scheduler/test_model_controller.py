"""The ModelConfig controller's pass over one namespace (model_resources.py), against a namespace's
models kept in a list: what a pass stores, when it writes nothing, and the outcome per resource."""

from __future__ import annotations

from agentmesh.scheduler.agent_controller import DefinitionRejected
from agentmesh.scheduler.model_resources import reconcile_models


class Store:
    def __init__(self, deployment=("default", "small"), refuse: str = ""):
        self.deployment = list(deployment)
        self.stored: dict[str, list[dict]] = {}
        self.writes = 0
        self.refuse = refuse

    async def deployment_models(self):
        return self.deployment

    async def models(self, namespace):
        return self.stored.get(namespace, [])

    async def set_models(self, namespace, models):
        if self.refuse:
            raise DefinitionRejected(self.refuse)
        self.writes += 1
        self.stored[namespace] = models


def resource(name: str, **spec) -> dict:
    return {"metadata": {"name": name, "namespace": "team-a", "generation": 1},
            "spec": {"provider": "openai", "model": "gpt-x", "apiKeySecret": {"name": "team-llm", "key": "api-key"},
                     **spec}}


async def test_a_pass_stores_the_entries_by_reference_and_then_writes_nothing():
    store = Store()
    outcomes = await reconcile_models("team-a", [resource("mine", contextWindow=8192, temperature=0.3)], store)
    assert outcomes["mine"].ready and outcomes["mine"].reason == "Synced"
    assert "Secret 'team-llm'" in outcomes["mine"].message
    [entry] = store.stored["team-a"]
    assert (entry["name"], entry["model"], entry["context_window"], entry["temperature"]) == ("mine", "gpt-x", 8192, 0.3)
    assert (entry["api_key_secret"], entry["api_key_secret_key"]) == ("team-llm", "api-key")
    await reconcile_models("team-a", [resource("mine", contextWindow=8192, temperature=0.3)], store)
    assert store.writes == 1


async def test_what_is_not_ready_is_left_out_and_a_deleted_resource_removes_its_model():
    store = Store()
    outcomes = await reconcile_models("team-a", [
        resource("mine"), resource("small"), resource("lost", fallback="nowhere"), resource("bad", provider="azure"),
        resource("chained", fallback="mine")], store)
    assert {n: (o.ready, o.reason) for n, o in outcomes.items()} == {
        "mine": (True, "Synced"), "chained": (True, "Synced"), "small": (False, "NameTaken"),
        "lost": (False, "ModelNotFound"), "bad": (False, "InvalidSpec")}
    assert [m["name"] for m in store.stored["team-a"]] == ["chained", "mine"]
    await reconcile_models("team-a", [resource("chained", fallback="small")], store)
    assert [m["name"] for m in store.stored["team-a"]] == ["chained"]


async def test_a_refusal_of_the_gateway_is_every_entry_s_invalid_spec():
    outcomes = await reconcile_models("team-a", [resource("mine")], Store(refuse="model 'mine': base_url must be ..."))
    assert (outcomes["mine"].ready, outcomes["mine"].reason) == (False, "InvalidSpec")
    assert "base_url" in outcomes["mine"].message
