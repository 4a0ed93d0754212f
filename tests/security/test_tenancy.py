"""One table says who may do what: REQUIRED_ROLES, the role each RPC needs, by method name, so a
method the gateway serves and the memory method it forwards to (SetProfile, DeleteSession, …)
cannot need different roles. Every RPC of every service has a row — an RPC added without one
fails here, and is refused to users meanwhile (fail closed)."""

from __future__ import annotations

from agentmesh.internal.v1 import agent_service_pb2, memory_service_pb2, tools_service_pb2
from agentmesh.tenancy import REQUIRED_ROLES, ROLES
from agentmesh.v1 import gateway_pb2, scheduler_pb2

SERVICES = ((gateway_pb2, "Gateway"), (scheduler_pb2, "Scheduler"), (agent_service_pb2, "Agent"),
            (memory_service_pb2, "Memory"), (tools_service_pb2, "Tools"))


def _methods():
    for module, service in SERVICES:
        for method in module.DESCRIPTOR.services_by_name[service].methods:
            yield service, method.name


def test_every_rpc_of_every_service_declares_its_role():
    missing = [f"{service}.{name}" for service, name in _methods() if name not in REQUIRED_ROLES]
    assert not missing, f"add a row to agentmesh.tenancy.REQUIRED_ROLES for {', '.join(missing)}"


def test_every_row_names_a_real_rpc_and_role():
    known = {name for _, name in _methods()}
    assert set(REQUIRED_ROLES) <= known, set(REQUIRED_ROLES) - known
    assert set(REQUIRED_ROLES.values()) <= set(ROLES)


def test_what_the_gateway_asks_an_admin_for_memory_does_too():
    # The issue this table closed: memory's own copy said member where the gateway said admin.
    for method in ("SetProfile", "SetSkillPolicy", "ApproveSkill", "RemoveSkill", "RemovePromotedTool",
                   "DeleteSession", "UpdateNamespaceSettings", "AddMcpServer", "RemoveMcpServer",
                   "PutMcpRegistration", "RemoveMcpRegistration"):
        assert REQUIRED_ROLES[method] == "admin", method


def test_the_policy_file_knows_the_same_roles():
    from agentmesh.tenancy.policy_file import VALID_ROLES

    assert VALID_ROLES == ROLES
