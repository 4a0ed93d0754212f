"""Every RPC a user can reach has a role in REQUIRED_ROLES: the one table of who may do what.
An RPC added without a row is refused to users where tenants are configured (fail closed);
this test names it so the row is added with the RPC."""

from __future__ import annotations

from agentmesh.rpc.auth import allowed_callers
from agentmesh.tenancy import REQUIRED_ROLES, ROLES
from agentmesh.v1 import gateway_pb2, memory_pb2, scheduler_pb2, tools_pb2


def _methods():
    for module, service in ((gateway_pb2, "Gateway"), (scheduler_pb2, "Scheduler"),
                            (memory_pb2, "Memory"), (tools_pb2, "Tools")):
        for method in module.DESCRIPTOR.services_by_name[service].methods:
            yield service, method.name


def test_every_rpc_users_can_call_declares_its_role():
    missing = [f"{service}.{name}" for service, name in _methods()
               if allowed_callers(service.lower(), name).users and f"{service}.{name}" not in REQUIRED_ROLES]
    assert not missing, f"add a row to agentmesh.tenancy.REQUIRED_ROLES for {', '.join(missing)}"


def test_every_row_names_a_real_rpc_and_role():
    known = {f"{service}.{name}" for service, name in _methods()}
    assert set(REQUIRED_ROLES) <= known, set(REQUIRED_ROLES) - known
    assert set(REQUIRED_ROLES.values()) <= set(ROLES)


def test_the_policy_file_knows_the_same_roles():
    from agentmesh.tenancy.policy_file import VALID_ROLES

    assert VALID_ROLES == ROLES
