"""What the agent learns stays in its tenant: with a policy of two tenants, one tenant's standing
instructions, skills and reflection history are neither readable nor changeable by the other,
through the gateway or calling the memory service directly; and the roles of REQUIRED_ROLES hold
(a viewer reads, only an admin changes the standing instructions)."""

from __future__ import annotations

import grpc

from agentmesh.internal.v1 import memory_service_pb2_grpc
from agentmesh.rpc.client import open_channel
from agentmesh.v1 import learning_pb2
from tests.e2e.conftest import rpc_error
from tests.e2e.test_tenants import auth, tenants  # noqa: F401 - the fixture

SKILL_MD = "---\nname: launch\ndescription: How beta launches.\n---\nRun the launch script.\n"


async def test_one_tenants_instructions_skills_and_reflections_are_not_the_others(tenants):  # noqa: F811
    stack, _ = tenants
    gateway = stack.gateway_stub()
    await gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="beta", part="soul", text="Beta's persona."),
                             metadata=auth("b-admin"), timeout=10)
    await gateway.PutSkill(learning_pb2.PutSkillRequest(namespace="beta", files=[learning_pb2.SkillFile(
        path="SKILL.md", content=SKILL_MD)]), metadata=auth("b-member"), timeout=10)

    # Tenant B reads its own.
    assert (await gateway.GetProfile(learning_pb2.GetProfileRequest(namespace="beta"), metadata=auth("b-member"))).soul \
        == "Beta's persona."
    listed = await gateway.ListSkills(learning_pb2.ListSkillsRequest(namespace="beta"), metadata=auth("b-member"))
    assert [s.name for s in listed.skills] == ["launch"]

    # Tenant A can neither read nor change them, through the gateway or at the memory service.
    memory = memory_service_pb2_grpc.MemoryStub(open_channel(stack.addresses["memory"]))
    for call in (
        gateway.GetProfile(learning_pb2.GetProfileRequest(namespace="beta"), metadata=auth("a-admin"), timeout=10),
        gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="beta", part="soul", text="Hijacked."),
                           metadata=auth("a-admin"), timeout=10),
        gateway.GetSkill(learning_pb2.GetSkillRequest(namespace="beta", name="launch"), metadata=auth("a-admin"), timeout=10),
        gateway.RemoveSkill(learning_pb2.SkillName(namespace="beta", name="launch"), metadata=auth("a-admin"), timeout=10),
        gateway.ListReflections(learning_pb2.ListReflectionsRequest(namespace="beta"), metadata=auth("a-admin"), timeout=10),
        memory.GetProfile(learning_pb2.GetProfileRequest(namespace="beta"), metadata=auth("a-admin"), timeout=10),
        memory.ListSkills(learning_pb2.ListSkillsRequest(namespace="beta"), metadata=auth("a-admin"), timeout=10),
    ):
        err = await rpc_error(call)
        assert err.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND), err
    kept = await gateway.GetProfile(learning_pb2.GetProfileRequest(namespace="beta"), metadata=auth("b-member"))
    assert kept.soul == "Beta's persona."
    assert [s.name for s in (await gateway.ListSkills(learning_pb2.ListSkillsRequest(namespace="beta"),
                                                      metadata=auth("b-member"))).skills] == ["launch"]

    # Roles in one's own tenant: a viewer reads; a member may not rewrite the standing instructions.
    assert (await gateway.GetProfile(learning_pb2.GetProfileRequest(namespace="acme"), metadata=auth("a-viewer"))).soul == ""
    denied = await rpc_error(gateway.SetProfile(learning_pb2.SetProfileRequest(namespace="acme", part="soul", text="x"),
                                                metadata=auth("a-member"), timeout=10))
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
