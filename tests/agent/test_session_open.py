"""What a turn that opens its session resolves from it: the rules the gateway applied before
(the turn's choice first, then the session's, then the deployment's; every policy layer kept)."""

from __future__ import annotations

import dataclasses

from agentmesh.agent.loop.run import TurnRequest
from agentmesh.agent.loop.session_open import NamedAgent, OpenedSession, SessionToOpen, resolve
from agentmesh.toolpolicy import ToolPolicy

DEPLOYMENT = ToolPolicy(deny=("web_fetch",))
MODELS = {"default", "second"}


def turn(**kw) -> TurnRequest:
    opening = SessionToOpen(deployment_tools=DEPLOYMENT, deployment_permission_mode="normal")
    return TurnRequest(session_id="s1", run_id="r1", message="hi", namespace="default", opening=opening, **kw)


def test_the_sessions_settings_apply_unless_the_turn_names_its_own():
    opened = OpenedSession(namespace="team", created=False, model="second", permission_mode="manual",
                           tools=ToolPolicy(deny=("python",)), namespace_tools=ToolPolicy(deny=("shell",)),
                           mcp_servers_version=7.0)
    resolved = resolve(turn(), opened, MODELS)
    assert (resolved.namespace, resolved.model, resolved.permission_mode) == ("team", "second", "manual")
    assert resolved.tool_policies == (DEPLOYMENT, ToolPolicy(deny=("shell",)), ToolPolicy(deny=("python",)))
    assert resolved.mcp_servers_version == 7.0 and resolved.opening is None  # a sub-agent opens nothing

    own = ToolPolicy(allow=("read_file",))
    resolved = resolve(turn(model="default", permission_mode="auto", tool_policies=(own,)), opened, MODELS)
    assert (resolved.model, resolved.permission_mode) == ("default", "auto")
    assert resolved.tool_policies[-1] == own  # the turn's narrowing stays, after the session's layers


def test_an_unknown_session_model_and_unset_modes_fall_back_to_the_deployment():
    opened = OpenedSession(namespace="default", created=True, model="gone-from-the-catalogue")
    resolved = resolve(turn(), opened, MODELS)
    assert (resolved.model, resolved.permission_mode) == ("", "normal")
    assert resolved.tool_policies == (DEPLOYMENT,)  # empty layers are left out


def test_a_named_agent_narrows_the_turn_and_never_widens_it():
    agent = NamedAgent(name="reviewer", version=3, instructions="You review.", model="second",
                       tools=ToolPolicy(allow=("read_file",)), permission_mode="manual",
                       approvals=frozenset({"shell"}), max_steps=5, token_budget=1000)
    opened = OpenedSession(namespace="team", created=False, model="default", agent=agent,
                           namespace_tools=ToolPolicy(deny=("shell",)))
    resolved = resolve(turn(max_iterations=9, token_budget=500, approval_tools=frozenset({"python"})), opened, MODELS)
    assert resolved.agent == agent and resolved.system_prompt == "You review."
    assert resolved.model == "second"  # the agent's over the session's
    # Its policy is one more layer, after every other: a tool must pass them all.
    assert resolved.tool_policies == (DEPLOYMENT, ToolPolicy(deny=("shell",)), ToolPolicy(allow=("read_file",)))
    assert (resolved.max_iterations, resolved.token_budget) == (5, 500)  # the smaller of each
    assert resolved.approval_tools == {"python", "shell"} and resolved.permission_mode == "manual"

    # The turn's own choices still win where the turn made them.
    resolved = resolve(turn(model="default", system_prompt="Mine."), opened, MODELS)
    assert (resolved.model, resolved.system_prompt) == ("default", "Mine.")
    # A model the deployment does not know is not used.
    stray = OpenedSession(namespace="team", created=False, agent=NamedAgent(name="x", version=1, instructions="x",
                                                                              model="unknown"))
    assert resolve(turn(), stray, MODELS).model == ""


def test_the_sandbox_template_is_the_agents_else_the_namespaces():
    opened = OpenedSession(namespace="team", created=False, namespace_sandbox_template="data")
    resolved = resolve(turn(), opened, MODELS)
    assert (resolved.sandbox_template, resolved.isolation) == ("data", "")
    agent = NamedAgent(name="scraper", version=1, instructions="x", sandbox_template="web", isolation="session")
    with_agent = OpenedSession(namespace="team", created=False, namespace_sandbox_template="data", agent=agent)
    resolved = resolve(turn(), with_agent, MODELS)
    assert (resolved.sandbox_template, resolved.isolation) == ("web", "session")
    # An agent that names none keeps the namespace's.
    plain = OpenedSession(namespace="team", created=False, namespace_sandbox_template="data",
                          agent=NamedAgent(name="plain", version=1, instructions="x"))
    assert resolve(turn(), plain, MODELS).sandbox_template == "data"
    assert resolve(turn(), OpenedSession(namespace="team", created=False), MODELS).sandbox_template == ""
    # The session's own is over the namespace's, the agent's over both.
    own = OpenedSession(namespace="team", created=False, namespace_sandbox_template="data", sandbox_template="mine")
    assert resolve(turn(), own, MODELS).sandbox_template == "mine"
    assert resolve(turn(), dataclasses.replace(own, agent=agent), MODELS).sandbox_template == "web"
