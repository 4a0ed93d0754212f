"""What only an admin may do, memory refuses a member too — however the call reaches it.

The gateway refuses a member's SetProfile, but memory is reachable directly: by the member's own
token (users may call it) and by any service signing a call for the member's principal. So memory
must hold the same line from the same table (agentmesh.tenancy.REQUIRED_ROLES). The memory
service runs on a real port with a policy of two tenants; every admin-only memory method is
called as a member of the namespace's tenant, each way it can be reached, and answers
PERMISSION_DENIED without changing anything; the same calls by an admin go through.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from agentmesh.config import Settings
from agentmesh.internal.v1 import memory_service_pb2, memory_service_pb2_grpc
from agentmesh.rpc.auth import allowed_callers, current_principal
from agentmesh.rpc.client import open_channel
from agentmesh.rpc.identity import Principal
from agentmesh.rpc.launch import start_service
from agentmesh.tenancy import REQUIRED_ROLES, token_digest
from agentmesh.v1 import agents_pb2, common_pb2, learning_pb2, sessions_pb2
from tests.support.identities import signed_channel

PEOPLE = ("a-admin", "a-member", "a-viewer", "b-admin", "b-member", "b-viewer")
TOKENS = {name: f"tok-{name}-0123456789" for name in PEOPLE}
SKILL = "---\nname: {name}\ndescription: How acme does {name}.\n---\nRun the {name} script.\n"


def _policy() -> str:
    accounts = [{"name": name, "token_sha256": token_digest(token), "tenant": "acme" if name[0] == "a" else "beta",
                 "role": name.split("-")[1]} for name, token in TOKENS.items()]
    return json.dumps({"tenants": {"acme": {"namespaces": ["acme"]}, "beta": {"namespaces": ["beta"]}},
                       "service_accounts": accounts})


def _skill(name: str, draft: bool = False) -> learning_pb2.PutSkillRequest:
    return learning_pb2.PutSkillRequest(namespace="acme", draft=draft, files=[
        learning_pb2.SkillFile(path="SKILL.md", content=SKILL.format(name=name))])


# Each admin-only memory method with a request that, from an admin, changes something of acme's.
ADMIN_ONLY = {
    "SetProfile": learning_pb2.SetProfileRequest(namespace="acme", part="soul", text="Obey the member."),
    "SetSkillPolicy": learning_pb2.SkillPolicy(namespace="acme", auto_accept=True),
    "ApproveSkill": learning_pb2.SkillName(namespace="acme", name="proposal"),
    "RemoveSkill": learning_pb2.SkillName(namespace="acme", name="deploy"),
    "RejectSkill": learning_pb2.SkillName(namespace="acme", name="late"),  # the draft put below, before the admin calls
    "RemovePromotedTool": learning_pb2.SkillName(namespace="acme", name="word_count"),
    "DeleteSession": sessions_pb2.DeleteSessionRequest(session_id="acme-s1"),
    "UpdateNamespaceSettings": sessions_pb2.UpdateNamespaceSettingsRequest(
        namespace="acme", tools=common_pb2.ToolPolicy(allow=["shell"])),
    "PutMcpRegistration": memory_service_pb2.PutMcpRegistrationRequest(
        namespace="acme", server=memory_service_pb2.McpRegistration(name="evil", command="/bin/true")),
    "RemoveMcpRegistration": memory_service_pb2.RemoveMcpRegistrationRequest(namespace="acme", name="docs"),
    # Named agents: a member runs them, only an admin defines them.
    "CreateAgent": agents_pb2.CreateAgentRequest(namespace="acme", spec=agents_pb2.AgentSpec(
        name="obedient", instructions="Obey the member.")),
    "UpdateAgent": agents_pb2.UpdateAgentRequest(namespace="acme", spec=agents_pb2.AgentSpec(
        name="obedient", instructions="Obey the member, always.")),
    "RollbackAgent": agents_pb2.RollbackAgentRequest(namespace="acme", name="obedient", version=1),
    "DeleteAgent": agents_pb2.DeleteAgentRequest(namespace="acme", name="obedient"),
    # Memory blocks: the drafts' ids are filled in by _set_up, which has the agent propose them.
    "RevertBlock": learning_pb2.RevertBlockRequest(namespace="acme", name="user", version=1),
    "SetBlock": learning_pb2.SetBlockRequest(namespace="acme", name="project", text="Obey the member."),
    "RestorePromotedTool": learning_pb2.PromotedTool(
        namespace="acme", name="obey", description="Obey the member.", function="obey",
        parameters_json=json.dumps({"type": "object", "properties": {}}), source="def obey(): return 0\n"),
    "RestoreBlock": memory_service_pb2.RestoreBlockRequest(block=learning_pb2.MemoryBlock(
        namespace="acme", name="persona", versions=[learning_pb2.BlockVersion(version=1, text="Obey the member.")])),
    "ApproveBlockEdit": learning_pb2.BlockEditRef(namespace="acme"),
    "RejectBlockEdit": learning_pb2.BlockEditRef(namespace="acme"),
    "SetBlockPolicy": learning_pb2.BlockPolicy(namespace="acme", edits="apply"),
    # Whoever holds a namespace's webhook secret can forge its run webhooks.
    "GetWebhookSecret": sessions_pb2.GetWebhookSecretRequest(namespace="acme"),
    "SetNamespaceWebhook": sessions_pb2.NamespaceWebhook(namespace="acme", default_url="https://example.com/h"),
    "Sweep": memory_service_pb2.SweepRequest(namespace="acme"),
    "EraseUser": sessions_pb2.EraseUserRequest(namespace="acme", user="oidc:nobody"),
    "RestoreSession": memory_service_pb2.RestoreSessionRequest(session=sessions_pb2.Session(
        session_id="acme-restored", namespace="acme")),
}


@pytest.fixture
async def memory(tmp_path: Path):
    policy = tmp_path / "policy.json"
    policy.write_text(_policy())
    env = {"AGENTMESH_HOME": str(tmp_path / "home"), "AGENTMESH_TRACES": "local", "AGENTMESH_DRAIN_S": "1",
           "AGENTMESH_AUTH_POLICY": str(policy)}
    settings = Settings.from_env(env)
    host = await start_service("memory", settings, "127.0.0.1:0")
    channels: list[grpc.aio.Channel] = []

    def stub(caller: str = "") -> memory_service_pb2_grpc.MemoryStub:
        """Memory as `caller` signs it (a service), or as a user's plain channel ("")."""
        channel = (signed_channel(settings.keys_dir, caller, "memory", host.target) if caller
                   else open_channel(host.target))
        channels.append(channel)
        return memory_service_pb2_grpc.MemoryStub(channel)

    try:
        yield stub
    finally:
        for channel in channels:
            await channel.close()
        await host.stop(grace=1)
        host.telemetry.shutdown()


def _user(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[name]}"),)


def _as(tenants: str):
    """Calls made from here on are signed for a principal with these tenants and roles."""
    return current_principal.set(Principal(subject="oidc:someone", tenant=tenants))


async def _acme(stub) -> dict:
    """Everything of acme's an admin-only method could change, as an admin reads it."""
    gateway, tools = stub("gateway"), stub("tools")
    token = _as("acme=admin")
    try:
        skills = await gateway.ListSkills(learning_pb2.ListSkillsRequest(namespace="acme", include_drafts=True))
        return {
            "profile": (await gateway.GetProfile(learning_pb2.GetProfileRequest(namespace="acme"))).soul,
            "skills": sorted((s.name, s.status) for s in skills.skills),
            "tools": sorted(t.name for t in (await gateway.ListPromotedTools(
                learning_pb2.ListPromotedToolsRequest(namespace="acme"))).tools),
            "session": (await gateway.GetSession(sessions_pb2.GetSessionRequest(session_id="acme-s1"))).session_id,
            "policy": list((await gateway.GetNamespaceSettings(
                sessions_pb2.GetNamespaceSettingsRequest(namespace="acme"))).tools.deny),
            "mcp": sorted(s.name for s in (await tools.ListMcpRegistrations(
                memory_service_pb2.ListMcpRegistrationsRequest(namespace="acme"))).servers),
        }
    finally:
        current_principal.reset(token)


async def _set_up(stub) -> None:
    gateway = stub("gateway")
    token = _as("acme=admin")
    try:
        await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="acme", part="soul", text="Acme's persona."))
        await gateway.PutSkill(_skill("deploy"))
        await gateway.PutSkill(_skill("proposal", draft=True))
        await gateway.PutSession(memory_service_pb2.PutSessionRequest(session=sessions_pb2.Session(
            session_id="acme-s1", namespace="acme")))
        await gateway.UpdateNamespaceSettings(sessions_pb2.UpdateNamespaceSettingsRequest(
            namespace="acme", tools=common_pb2.ToolPolicy(deny=["shell"])))
        await stub("tools").PutMcpRegistration(memory_service_pb2.PutMcpRegistrationRequest(
            namespace="acme", server=memory_service_pb2.McpRegistration(name="docs", command="/bin/true")))
    finally:
        current_principal.reset(token)
    token = _as("acme=member")  # the agent stores a promoted tool for the member whose turn made it
    try:
        agent = stub("agent")
        await agent.EditBlock(learning_pb2.EditBlockRequest(namespace="acme", name="user", change="append",
                                                            text="The user is Ada."))
        current_principal.reset(token)
        token = _as("acme=admin")
        await stub("gateway").SetBlockPolicy(learning_pb2.BlockPolicy(namespace="acme", edits="draft"))
        current_principal.reset(token)
        token = _as("acme=member")
        for method in ("ApproveBlockEdit", "RejectBlockEdit"):
            proposed = await agent.EditBlock(learning_pb2.EditBlockRequest(
                namespace="acme", name="user", change="append", text=f"Proposed for {method}."))
            ADMIN_ONLY[method].draft_id = proposed.draft.id
        await stub("agent").PutPromotedTool(learning_pb2.PromotedTool(
            namespace="acme", name="word_count", description="Count words.", function="word_count",
            parameters_json=json.dumps({"type": "object", "properties": {}}), source="def word_count(): return 0\n"))
    finally:
        current_principal.reset(token)


def test_the_admin_only_memory_methods_are_the_tables():
    table = {method for method, role in REQUIRED_ROLES.items() if role == "admin" and method in _memory_methods()}
    assert table == set(ADMIN_ONLY), "give each admin-only memory method a request in ADMIN_ONLY"


def _memory_methods() -> set[str]:
    return {m.name for m in memory_service_pb2.DESCRIPTOR.services_by_name["Memory"].methods}


async def test_a_member_calling_memory_directly_cannot_do_what_only_an_admin_may(memory):
    await _set_up(memory)
    before = await _acme(memory)
    assert before == {"profile": "Acme's persona.", "skills": [("deploy", "active"), ("proposal", "draft")],
                      "tools": ["word_count"], "session": "acme-s1", "policy": ["shell"], "mcp": ["docs"]}

    tried = 0
    for method, request in ADMIN_ONLY.items():
        allowed = allowed_callers("memory", method)
        # The member's own token, where users may call the method at all.
        if allowed.users:
            err = await _refused(getattr(memory(), method)(request, metadata=_user("a-member"), timeout=10))
            assert "admin" in err.details(), (method, err.details())
            tried += 1
        # Every service that may call it, signing the call for a member of acme (an admin elsewhere
        # does not help: the role counts in the tenant that owns the namespace).
        for caller in sorted(allowed.services):
            for tenants in ("acme=member", "acme=member,beta=admin"):
                token = _as(tenants)
                try:
                    err = await _refused(getattr(memory(caller), method)(request, timeout=10))
                finally:
                    current_principal.reset(token)
                assert err.details() == "this needs the admin role in tenant 'acme'; you are member there", \
                    (method, caller, err.details())
                tried += 1
    assert tried >= 2 * len(ADMIN_ONLY)
    # Nothing changed; in particular a draft still waits for a person (auto-accept stayed off).
    assert await _acme(memory) == before
    token = _as("acme=admin")
    try:
        late = await memory("gateway").PutSkill(_skill("late", draft=True))
    finally:
        current_principal.reset(token)
    assert late.status == "draft"

    # The same calls from an admin of acme go through.
    for method, request in ADMIN_ONLY.items():
        caller = sorted(allowed_callers("memory", method).services)[0]
        token = _as("acme=admin")
        try:
            await getattr(memory(caller), method)(request, timeout=10)
        finally:
            current_principal.reset(token)
    after = await _acme_after_admin(memory)
    assert after == {"profile": "Obey the member.", "tools": ["obey"], "mcp": ["evil"], "policy": []}


async def _acme_after_admin(stub) -> dict:
    gateway, tools = stub("gateway"), stub("tools")
    token = _as("acme=admin")
    try:
        return {
            "profile": (await gateway.GetProfile(learning_pb2.GetProfileRequest(namespace="acme"))).soul,
            "tools": [t.name for t in (await gateway.ListPromotedTools(
                learning_pb2.ListPromotedToolsRequest(namespace="acme"))).tools],
            "mcp": sorted(s.name for s in (await tools.ListMcpRegistrations(
                memory_service_pb2.ListMcpRegistrationsRequest(namespace="acme"))).servers),
            "policy": list((await gateway.GetNamespaceSettings(
                sessions_pb2.GetNamespaceSettingsRequest(namespace="acme"))).tools.deny),
        }
    finally:
        current_principal.reset(token)


async def _refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value.details()
    return caught.value
