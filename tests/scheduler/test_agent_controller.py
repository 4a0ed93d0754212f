"""The agent controller's pass over one namespace (agent_controller.py), against the real gateway
adapter's spec conversion and a namespace's agents kept in a dict: what a pass creates, updates,
leaves alone and deletes, and the status it writes."""

from __future__ import annotations

from agentmesh.scheduler.agent_controller import (
    DefinitionRejected,
    Outcome,
    StoredAgent,
    reconcile_namespace,
    status_of,
)
from agentmesh.scheduler.agent_resources import GatewayAgentDefinitions


class Definitions(GatewayAgentDefinitions):
    """A namespace's agents as the gateway keeps them: versions counted, built-ins listed. The
    adapter's own spec conversion (`canonical`); its calls to the gateway replaced."""

    def __init__(self, models=("default",)):  # the adapter's __init__ wants a gateway client: none here
        self.stored: dict[str, StoredAgent] = {}
        self.calls: list[tuple[str, str]] = []
        self._models = list(models)

    async def agents(self, namespace):
        builtins = [StoredAgent(n, 0, True, {}) for n in ("code", "explore", "plan")]
        return builtins + list(self.stored.values())

    async def models(self, namespace):
        return self._models

    async def create(self, namespace, name, spec):
        return self._put("create", name, spec, 1)

    async def update(self, namespace, name, spec):
        return self._put("update", name, spec, self.stored[name].version + 1)

    def _put(self, verb, name, spec, version):
        if not spec.get("instructions", "").strip():
            raise DefinitionRejected(f"agent {name!r} has no instructions: say what the agent is for")
        self.calls.append((verb, name))
        self.stored[name] = StoredAgent(name, version, False, spec)
        return version

    async def delete(self, namespace, name):
        self.calls.append(("delete", name))
        del self.stored[name]


def resource(name: str, generation: int = 1, **spec) -> dict:
    return {"metadata": {"name": name, "namespace": "team-a", "generation": generation},
            "spec": {"instructions": f"You are {name}.", **spec}}


async def test_a_pass_creates_then_changes_nothing_until_the_spec_changes():
    defs = Definitions()
    first = [resource("reviewer", description="Reviews\n a change.", model="default", subAgents=["explore"])]
    assert await reconcile_namespace("team-a", first, defs) == {
        "reviewer": Outcome(True, "Synced", "agent 'reviewer' of namespace 'team-a' is at version 1", 1)}
    # The same resource again (its description as memory stores it, on one line): no new version.
    await reconcile_namespace("team-a", first, defs)
    assert defs.calls == [("create", "reviewer")]
    changed = [resource("reviewer", 2, description="Reviews a change.", model="default", budgets={"steps": 5})]
    assert (await reconcile_namespace("team-a", changed, defs))["reviewer"].version == 2
    assert defs.calls == [("create", "reviewer"), ("update", "reviewer")]


async def test_an_agent_without_its_resource_is_deleted_on_the_next_pass():
    """As after a resource was deleted while no scheduler led: the relist catches it up."""
    defs = Definitions()
    await reconcile_namespace("team-a", [resource("a"), resource("b")], defs)
    await reconcile_namespace("team-a", [resource("b")], defs)
    assert sorted(defs.stored) == ["b"] and defs.calls[-1] == ("delete", "a")


async def test_what_is_not_ready_changes_nothing():
    defs = Definitions(models=["default", "small"])
    await reconcile_namespace("team-a", [resource("r", model="small")], defs)
    outcomes = await reconcile_namespace("team-a", [
        resource("r", 2, model="gpt-9"), resource("boss", subAgents=["ghost", "r"]),
        resource("typo", tools={"allow": "read_file"}), resource("empty", instructions="  ")], defs)
    assert {n: (o.ready, o.reason) for n, o in outcomes.items()} == {
        "r": (False, "ModelNotFound"), "boss": (False, "SubAgentNotFound"), "typo": (False, "InvalidSpec"),
        "empty": (False, "InvalidSpec")}
    assert "'gpt-9'" in outcomes["r"].message and "default, small" in outcomes["r"].message
    assert "ghost" in outcomes["boss"].message and "'r'" not in outcomes["boss"].message
    assert "spec.tools.allow" in outcomes["typo"].message
    assert "no instructions" in outcomes["empty"].message
    # The agent keeps its last good version; nothing was created for the others.
    assert defs.stored["r"].spec["model"] == "small" and sorted(defs.stored) == ["r"]


def test_the_ready_condition_keeps_its_transition_time_while_it_holds():
    res = resource("r", 3)
    status = status_of(res, Outcome(True, "Synced", "at version 2", 2))
    assert status["observedGeneration"] == 3 and status["version"] == 2
    (condition,) = status["conditions"]
    assert (condition["type"], condition["status"], condition["observedGeneration"]) == ("Ready", "True", 3)
    res["status"] = {**status, "conditions": [{**condition, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    again = status_of(res, Outcome(True, "Synced", "at version 2", 2))
    assert again == res["status"]  # nothing to write
    failed = status_of(res, Outcome(False, "ModelNotFound", "no such model"))
    assert failed["conditions"][0]["lastTransitionTime"] != "2026-01-01T00:00:00Z" and "version" not in failed
